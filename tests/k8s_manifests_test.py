#!/usr/bin/env python3
"""Runs a rendered Kubernetes overlay as local processes, as a kubelet would.

Renders tools/k8s/overlays/<overlay> with `kubectl kustomize`, then starts
every pod of its StatefulSets, Deployments and Indexed Jobs as a local
process running exactly the container's command and args, with its env, as
the kubelet fills them in:

  - env values and valueFrom (fieldRef: the pod-index label, the Job's
    completion-index annotation, metadata.name, status.podIP; configMapKeyRef),
    envFrom configMapRef, and JOB_COMPLETION_INDEX for Indexed Jobs;
  - $(VAR) references in command, args and env, with $$ for a literal $;
  - volumes: a configMap's keys become files in a temporary directory,
    persistentVolumeClaims (also from volumeClaimTemplates) and emptyDirs
    become temporary directories, and every mountPath in the command, args
    and env is rewritten to its directory;
  - networking: every pod gets its own loopback address 127.a.b.x; a listen
    address 0.0.0.0:PORT becomes 127.a.b.x:PORT, and a Service name
    <pod>.<service>[.<namespace>[.svc[.cluster.local]]] becomes that pod's
    address;
  - the image's /usr/local/bin/<daemon> becomes the built binary.

It checks the servers' gRPC startup, readiness and liveness probes (with
tools/k8s/health_probe), that every Job pod exits 0, and that on SIGTERM every
server exits 0 within terminationGracePeriodSeconds leaving its checkpoint,
and that a restarted shard resumes from it. Every pod's command line and exit
code is logged.

  tests/k8s_manifests_test.py [--overlay_dir=DIR | --rendered=FILE]
      [--bin_dir=bazel-bin]

Under `bazel test` it finds the overlay and the binaries in its runfiles.
Skips (exit 0, with a message) where kubectl is absent.
"""

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

BINARIES = {
    "ps_server": "server/ps_server",
    "ps_worker": "worker/ps_worker",
    "ps_evaluator": "worker/ps_evaluator",
}
WORKER_TIMEOUT_S = 240


class Failure(Exception):
    pass


def log(message):
    print(f"[k8s-test] {message}", flush=True)


def render(overlay_dir):
    """kubectl kustomize, on a copy with symlinks resolved (Bazel's runfiles
    are symlinks, which kustomize's loader refuses outside the root)."""
    k8s_root = os.path.dirname(os.path.dirname(os.path.abspath(overlay_dir)))
    work = tempfile.mkdtemp(prefix="monsoon-k8s-render-")
    copy = os.path.join(work, "k8s")
    shutil.copytree(k8s_root, copy, symlinks=False,
                    ignore=shutil.ignore_patterns("node_modules"))
    target = os.path.join(copy, os.path.relpath(os.path.abspath(overlay_dir),
                                                k8s_root))
    result = subprocess.run(["kubectl", "kustomize", target],
                            capture_output=True, text=True)
    shutil.rmtree(work, ignore_errors=True)
    if result.returncode != 0:
        raise Failure(f"kubectl kustomize {overlay_dir} failed:\n{result.stderr}")
    return result.stdout


def expand(text, env):
    """Kubernetes' $(VAR) expansion: $$ is a literal $, unknown names stay."""
    def replace(match):
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, text)


class Pod:
    def __init__(self, name, kind, owner, spec, labels, annotations, ip,
                 termination_grace_s):
        self.name = name
        self.kind = kind
        self.owner = owner
        self.spec = spec
        self.labels = labels
        self.annotations = annotations
        self.ip = ip
        self.termination_grace_s = termination_grace_s
        self.process = None
        self.argv = None
        self.env = None
        self.log_path = None
        self.volume_dirs = {}  # volume name -> local directory


class Cluster:
    def __init__(self, objects, bin_dir, probe, work_dir):
        self.objects = objects
        self.bin_dir = bin_dir
        self.probe = probe
        self.work_dir = work_dir
        self.config_maps = {o["metadata"]["name"]: o.get("data", {})
                            for o in objects if o["kind"] == "ConfigMap"}
        self.pods = []
        self.hosts = {}  # DNS name -> loopback address
        # A random 127.x.y.0/24 per run, so that runs side by side (or a
        # process left over) do not collide on the manifests' fixed ports.
        self.prefix = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        self.next_ip = 10
        self.claims = {}  # PVC name -> directory (kept across restarts)

    def _ip(self):
        ip = f"{self.prefix}.{self.next_ip}"
        self.next_ip += 1
        return ip

    def plan(self):
        services = {o["metadata"]["name"]: o for o in self.objects
                    if o["kind"] == "Service"}
        for o in self.objects:
            kind, name = o["kind"], o["metadata"]["name"]
            if kind not in ("StatefulSet", "Deployment", "Job"):
                continue
            spec = o["spec"]
            template = spec["template"]
            labels = dict(template.get("metadata", {}).get("labels", {}))
            grace = template["spec"].get("terminationGracePeriodSeconds", 30)
            if kind == "StatefulSet":
                count = spec.get("replicas", 1)
            elif kind == "Deployment":
                count = spec.get("replicas", 1)
            else:
                if spec.get("completionMode") != "Indexed":
                    raise Failure(f"Job {name}: completionMode is not Indexed")
                count = spec.get("completions", 1)
            for i in range(count):
                pod_labels = dict(labels)
                annotations = {}
                if kind == "StatefulSet":
                    pod_name = f"{name}-{i}"
                    pod_labels["apps.kubernetes.io/pod-index"] = str(i)
                    pod_labels["statefulset.kubernetes.io/pod-name"] = pod_name
                elif kind == "Job":
                    pod_name = f"{name}-{i}"
                    annotations["batch.kubernetes.io/job-completion-index"] = str(i)
                    pod_labels["batch.kubernetes.io/job-completion-index"] = str(i)
                else:
                    pod_name = f"{name}-{i}"
                pod = Pod(pod_name, kind, name, template["spec"], pod_labels,
                          annotations, self._ip(), grace)
                if kind == "StatefulSet":
                    service = spec.get("serviceName", "")
                    if service not in services:
                        raise Failure(f"StatefulSet {name}: no Service "
                                      f"'{service}' for serviceName")
                    for suffix in ("", ".default", ".default.svc",
                                   ".default.svc.cluster.local"):
                        self.hosts[f"{pod_name}.{service}{suffix}"] = pod.ip
                    for claim in spec.get("volumeClaimTemplates", []):
                        cname = f"{claim['metadata']['name']}-{pod_name}"
                        pod.volume_dirs[claim["metadata"]["name"]] = \
                            self._claim(cname)
                self.pods.append(pod)

    def _claim(self, name):
        if name not in self.claims:
            path = os.path.join(self.work_dir, "pvc", name)
            os.makedirs(path)
            self.claims[name] = path
        return self.claims[name]

    def _volumes(self, pod):
        for volume in pod.spec.get("volumes", []):
            vname = volume["name"]
            if "configMap" in volume:
                cm = volume["configMap"]["name"]
                if cm not in self.config_maps:
                    raise Failure(f"{pod.name}: no ConfigMap {cm}")
                path = os.path.join(self.work_dir, "cm", pod.name, vname)
                os.makedirs(path, exist_ok=True)
                for key, value in self.config_maps[cm].items():
                    with open(os.path.join(path, key), "w") as f:
                        f.write(value)
                pod.volume_dirs[vname] = path
            elif "persistentVolumeClaim" in volume:
                pod.volume_dirs[vname] = self._claim(
                    volume["persistentVolumeClaim"]["claimName"])
            elif "emptyDir" in volume:
                path = os.path.join(self.work_dir, "empty", pod.name, vname)
                os.makedirs(path, exist_ok=True)
                pod.volume_dirs[vname] = path
            else:
                raise Failure(f"{pod.name}: volume {vname} of a kind this "
                              "test does not emulate")

    def _field(self, pod, path):
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]",
                             path)
        if match:
            source = pod.labels if match.group(1) == "labels" else pod.annotations
            if match.group(2) not in source:
                raise Failure(f"{pod.name}: fieldRef {path}: no such "
                              f"{match.group(1)[:-1]} on the pod")
            return source[match.group(2)]
        if path == "metadata.name":
            return pod.name
        if path == "status.podIP":
            return pod.ip
        if path == "metadata.namespace":
            return "default"
        raise Failure(f"{pod.name}: fieldRef {path} is not emulated")

    def prepare(self, pod):
        containers = pod.spec["containers"]
        if len(containers) != 1:
            raise Failure(f"{pod.name}: expected one container")
        c = containers[0]
        self._volumes(pod)
        env = {}
        if pod.kind == "Job":
            env["JOB_COMPLETION_INDEX"] = pod.annotations[
                "batch.kubernetes.io/job-completion-index"]
        for source in c.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref is None or ref["name"] not in self.config_maps:
                raise Failure(f"{pod.name}: envFrom {source} not found")
            for key, value in self.config_maps[ref["name"]].items():
                env[source.get("prefix", "") + key] = value
        for var in c.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif "valueFrom" in var:
                vf = var["valueFrom"]
                if "fieldRef" in vf:
                    env[var["name"]] = self._field(pod, vf["fieldRef"]["fieldPath"])
                elif "configMapKeyRef" in vf:
                    ref = vf["configMapKeyRef"]
                    env[var["name"]] = self.config_maps[ref["name"]][ref["key"]]
                else:
                    raise Failure(f"{pod.name}: env {var['name']}: valueFrom "
                                  "not emulated")
            else:
                env[var["name"]] = ""
        mounts = sorted(((m["mountPath"], pod.volume_dirs[m["name"]])
                         for m in c.get("volumeMounts", [])),
                        key=lambda m: -len(m[0]))

        def localize(text):
            for mount_path, local in mounts:
                text = text.replace(mount_path, local)
            text = re.sub(r"\b0\.0\.0\.0:", f"{pod.ip}:", text)
            for host in sorted(self.hosts, key=len, reverse=True):
                text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?=:)",
                              self.hosts[host], text)
            return text

        argv = [expand(a, env) for a in c.get("command", []) + c.get("args", [])]
        if not argv:
            raise Failure(f"{pod.name}: no command (the image's entrypoint is "
                          "not emulated)")
        daemon = os.path.basename(argv[0])
        if daemon not in BINARIES:
            raise Failure(f"{pod.name}: command {argv[0]} is not a Monsoon daemon")
        argv[0] = os.path.join(self.bin_dir, BINARIES[daemon])
        pod.argv = [argv[0]] + [localize(a) for a in argv[1:]]
        pod.env = {k: localize(v) for k, v in env.items()}

    def start(self, pod, suffix=""):
        if pod.argv is None:
            self.prepare(pod)
        pod.log_path = os.path.join(self.work_dir, f"{pod.name}{suffix}.log")
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        environment.update(pod.env)
        shown_env = " ".join(f"{k}={v}" for k, v in sorted(pod.env.items()))
        log(f"start {pod.name} ({pod.kind} {pod.owner}, {pod.ip}): "
            f"{shown_env + ' ' if shown_env else ''}{' '.join(pod.argv)}")
        pod.process = subprocess.Popen(
            pod.argv, env=environment, stdout=open(pod.log_path, "w"),
            stderr=subprocess.STDOUT, start_new_session=True)

    def tail(self, pod, lines=15):
        try:
            with open(pod.log_path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def probe_grpc(self, pod, probe, name):
        """Runs a gRPC probe as the kubelet would: a startup probe until it
        succeeds or periodSeconds * failureThreshold have passed (or the
        process has exited), the others once."""
        if "grpc" not in probe:
            raise Failure(f"{pod.name}: {name} is not a gRPC probe")
        port = probe["grpc"]["port"]
        timeout = probe.get("timeoutSeconds", 1)
        budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
        deadline = time.monotonic() + (budget if name == "startupProbe" else 0)
        cmd = [self.probe, f"--addr={pod.ip}:{port}", f"--timeout_s={timeout}"]
        if probe["grpc"].get("service"):
            cmd.append(f"--service={probe['grpc']['service']}")
        while True:
            result = subprocess.run(cmd, capture_output=True, text=True,
                                    timeout=timeout + 30)
            if result.returncode == 0 or time.monotonic() >= deadline:
                break
            if pod.process.poll() is not None:
                raise Failure(f"{pod.name} exited with code "
                              f"{pod.process.returncode} before its {name} "
                              f"succeeded:\n{self.tail(pod)}")
            time.sleep(0.2)  # the kubelet's period, shortened
        log(f"{name} of {pod.name}: {result.stdout.strip()} "
            f"(exit {result.returncode})")
        if result.returncode != 0:
            raise Failure(f"{pod.name}: {name} failed: {result.stdout}"
                          f"{result.stderr}\n{self.tail(pod)}")

    def terminate(self, pod):
        """SIGTERM, then wait terminationGracePeriodSeconds (then SIGKILL)."""
        pod.process.send_signal(signal.SIGTERM)
        try:
            code = pod.process.wait(timeout=pod.termination_grace_s)
        except subprocess.TimeoutExpired:
            pod.process.kill()
            pod.process.wait()
            raise Failure(f"{pod.name}: still running "
                          f"{pod.termination_grace_s} s after SIGTERM "
                          f"(terminationGracePeriodSeconds); killed\n"
                          f"{self.tail(pod)}")
        log(f"exit {pod.name}: code {code} after SIGTERM")
        return code

    def kill_all(self):
        for pod in self.pods:
            if pod.process is not None and pod.process.poll() is None:
                pod.process.kill()
                pod.process.wait()


def check_static(objects):
    kinds = {}
    for o in objects:
        kinds.setdefault(o["kind"], []).append(o)
    for kind in ("StatefulSet", "Service", "Job", "PodDisruptionBudget",
                 "ConfigMap"):
        if kind not in kinds:
            raise Failure(f"no {kind} in the rendered manifests")
    for sts in kinds["StatefulSet"]:
        spec = sts["spec"]
        if spec.get("podManagementPolicy") != "Parallel":
            raise Failure(f"StatefulSet {sts['metadata']['name']}: "
                          "podManagementPolicy is not Parallel")
        if not spec.get("volumeClaimTemplates"):
            raise Failure("StatefulSet: no volumeClaimTemplates")
    for job in kinds["Job"]:
        spec = job["spec"]
        if spec["template"]["spec"].get("restartPolicy") != "Never":
            raise Failure("Job: restartPolicy is not Never")
        rules = spec.get("podFailurePolicy", {}).get("rules", [])
        if not any(r.get("action") == "FailJob" and
                   2 in r.get("onExitCodes", {}).get("values", []) and
                   r["onExitCodes"].get("operator") == "In" for r in rules):
            raise Failure("Job: no podFailurePolicy rule failing the Job on "
                          "exit code 2")


def run(objects, bin_dir, probe):
    check_static(objects)
    work_dir = tempfile.mkdtemp(prefix="monsoon-k8s-pods-")
    cluster = Cluster(objects, bin_dir, probe, work_dir)
    cluster.plan()
    servers = [p for p in cluster.pods if p.kind == "StatefulSet"]
    services = [p for p in cluster.pods if p.kind == "Deployment"]
    workers = [p for p in cluster.pods if p.kind == "Job"]
    try:
        for pod in servers:
            cluster.start(pod)
        for pod in servers:
            c = pod.spec["containers"][0]
            for name in ("startupProbe", "readinessProbe", "livenessProbe"):
                if name not in c:
                    raise Failure(f"{pod.name}: no {name}")
                if pod.process.poll() is not None:
                    raise Failure(f"{pod.name} exited with code "
                                  f"{pod.process.returncode}:\n"
                                  f"{cluster.tail(pod)}")
                cluster.probe_grpc(pod, c[name], name)
        for pod in services + workers:
            cluster.start(pod)
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        failed = []
        for pod in workers:
            try:
                code = pod.process.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise Failure(f"{pod.name} still running after "
                              f"{WORKER_TIMEOUT_S} s:\n{cluster.tail(pod)}")
            log(f"exit {pod.name}: code {code}")
            if code != 0:
                failed.append(f"{pod.name} exited with code {code}:\n"
                              f"{cluster.tail(pod)}")
        for pod in servers + services:
            if pod.process.poll() is not None:
                failed.append(f"{pod.name} exited early with code "
                              f"{pod.process.returncode}:\n{cluster.tail(pod)}")
        if failed:
            raise Failure("\n".join(failed))
        for pod in services:
            code = cluster.terminate(pod)
            if code != 0:
                raise Failure(f"{pod.name}: exit code {code} after SIGTERM\n"
                              f"{cluster.tail(pod)}")
        checkpoints = {}
        for pod in servers:
            code = cluster.terminate(pod)
            if code != 0:
                raise Failure(f"{pod.name}: exit code {code} after SIGTERM\n"
                              f"{cluster.tail(pod)}")
            found = [os.path.join(d, f) for d in pod.volume_dirs.values()
                     for f in os.listdir(d) if f.endswith(".ckpt")]
            index = pod.labels["apps.kubernetes.io/pod-index"]
            wanted = f"shard-{index}-of-{len(servers)}.ckpt"
            if [os.path.basename(f) for f in found] != [wanted]:
                raise Failure(f"{pod.name}: expected checkpoint {wanted}, "
                              f"found {found}\n{cluster.tail(pod)}")
            checkpoints[pod.name] = found[0]
            log(f"{pod.name} left {wanted} ({os.path.getsize(found[0])} bytes)")
        # A rescheduled shard resumes from its volume.
        pod = servers[0]
        cluster.start(pod, suffix="-restarted")
        cluster.probe_grpc(pod, pod.spec["containers"][0]["startupProbe"],
                           "startupProbe")
        code = cluster.terminate(pod)
        log_text = cluster.tail(pod, 50)
        if code != 0 or "resumed from" not in log_text:
            raise Failure(f"restarted {pod.name}: exit code {code}, expected 0 "
                          f"and a 'resumed from' line:\n{log_text}")
        log(f"restarted {pod.name} resumed: "
            f"{[l for l in log_text.splitlines() if 'resumed from' in l][0]}")
    finally:
        cluster.kill_all()
    shutil.rmtree(work_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlay_dir")
    parser.add_argument("--rendered", help="already rendered YAML")
    parser.add_argument("--bin_dir")
    parser.add_argument("--probe")
    args = parser.parse_args()
    runfiles = os.environ.get("TEST_SRCDIR")
    if runfiles:
        root = os.path.join(runfiles, os.environ.get("TEST_WORKSPACE", "__main__"))
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bin_dir = args.bin_dir or (root if runfiles else os.path.join(root, "bazel-bin"))
    probe = args.probe or os.path.join(bin_dir, "tools/k8s/health_probe")
    if args.rendered:
        with open(args.rendered) as f:
            text = f.read()
    else:
        if shutil.which("kubectl") is None:
            print("SKIPPED: kubectl is not installed; the manifests were not "
                  "rendered or run")
            return 0
        overlay = args.overlay_dir or os.path.join(
            root, "tools/k8s/overlays/cpu-small")
        text = render(overlay)
    objects = [o for o in yaml.safe_load_all(text) if o]
    started = time.monotonic()
    try:
        run(objects, bin_dir, probe)
    except Failure as failure:
        log(f"FAILED: {failure}")
        return 1
    log(f"PASSED in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
