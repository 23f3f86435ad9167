#!/usr/bin/env python3
"""Checks the kubectl commands of tools/k8s/README.md against the rendered
manifests: every `kubectl ... -k DIR` names a directory that renders, every
TYPE/NAME (job/ps, pod/monsoon-collect, ...) names an object of those
renders, every label selector (-l k=v,...) selects a pod template or a
claim, and every `kubectl cp POD:PATH` copies from under one of that pod's
mount paths.

  readme.py README.md RENDERED.yaml... (the renders of the overlays and
  collect/ that the README's commands apply)

Prints one line per problem and exits 1 if there is any.
"""
import os
import re
import shlex
import sys

import yaml

KINDS = {"job": "Job", "pod": "Pod", "deploy": "Deployment",
         "deployment": "Deployment", "statefulset": "StatefulSet",
         "pvc": "PersistentVolumeClaim", "svc": "Service",
         "configmap": "ConfigMap", "secret": "Secret"}


def templates(objects):
    """(name prefix of its pods, labels, pod spec) of every pod template."""
    for o in objects:
        if o["kind"] == "Pod":
            yield o["metadata"]["name"], o["metadata"].get("labels", {}), o["spec"]
        elif "template" in o.get("spec", {}):
            t = o["spec"]["template"]
            yield (o["metadata"]["name"], t.get("metadata", {}).get("labels", {}),
                   t["spec"])


def main():
    readme, rendered = sys.argv[1], sys.argv[2:]
    objects = []
    for path in rendered:
        with open(path) as f:
            objects += [o for o in yaml.safe_load_all(f) if o]
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(readme))))
    with open(readme) as f:
        text = f.read()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    problems = []
    commands = 0
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        line = line.split("#")[0].strip()
        for command in re.split(r"&&|;|\|", line):
            words = shlex.split(command.strip()) if command.strip() else []
            if not words or words[0] != "kubectl":
                continue
            commands += 1
            where = " ".join(words)
            for i, word in enumerate(words):
                if word == "-k" and i + 1 < len(words):
                    if not os.path.isfile(os.path.join(
                            root, words[i + 1], "kustomization.yaml")):
                        problems.append(f"{where}: no kustomization at {words[i + 1]}")
                match = re.fullmatch(r"([a-z]+)/([a-z0-9.-]+)", word)
                if match and match.group(1) in KINDS and words[1] not in ("label",):
                    kind = KINDS[match.group(1)]
                    if kind == "Secret":
                        continue
                    if not any(o["kind"] == kind and
                               o["metadata"]["name"] == match.group(2)
                               for o in objects):
                        problems.append(f"{where}: no {kind} {match.group(2)} "
                                        "in the rendered manifests")
                if word == "-l" and i + 1 < len(words) and words[1] != "label":
                    wanted = dict(p.split("=", 1) for p in words[i + 1].split(","))
                    labelled = [labels for _, labels, _ in templates(objects)] + [
                        o["metadata"].get("labels", {}) for o in objects
                        if o["kind"] == "PersistentVolumeClaim"]
                    if not any(all(l.get(k) == v for k, v in wanted.items())
                               for l in labelled):
                        problems.append(f"{where}: -l {words[i + 1]} selects no "
                                        "pod or claim of the rendered manifests")
            if len(words) > 3 and words[1] == "cp":
                source = words[2]
                pod, _, path = source.partition(":")
                if not path or pod.startswith("$") or "<" in pod:
                    continue
                spec = next((s for name, _, s in templates(objects)
                             if pod == name or pod.startswith(name + "-")), None)
                if spec is None:
                    problems.append(f"{where}: no pod {pod} in the manifests")
                    continue
                mounts = [m["mountPath"] for c in spec["containers"]
                          for m in c.get("volumeMounts", [])]
                if not any(path == m or path.startswith(m.rstrip("/") + "/")
                           for m in mounts):
                    problems.append(f"{where}: {path} is on no volume of {pod} "
                                    f"(mounts {mounts})")
    for p in problems:
        print(f"README: {p}")
    if commands == 0:
        print("README: no kubectl command found")
        return 1
    print(f"README: {commands} kubectl commands checked against the manifests"
          if not problems else "")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
