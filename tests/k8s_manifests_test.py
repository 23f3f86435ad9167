#!/usr/bin/env python3
"""Runs a rendered Kubernetes overlay as a kubelet would: as local processes,
or as containers of the built image.

Renders tools/k8s/overlays/<overlay> with `kubectl kustomize`, then starts
every pod of its Jobs (Indexed or not), StatefulSets and Deployments running
exactly the container's command and args, with its env, as the kubelet
fills them in:

  - env values and valueFrom (fieldRef: the pod-index label, the Job's
    completion-index annotation, metadata.name, status.podIP; configMapKeyRef),
    envFrom configMapRef, and JOB_COMPLETION_INDEX for Indexed Jobs;
  - $(VAR) references in command, args and env, with $$ for a literal $;
  - volumes: a configMap's keys become files in a temporary directory,
    persistentVolumeClaims (also from volumeClaimTemplates) and emptyDirs
    become temporary directories (a claim keeps its directory across pods);
  - Secrets, which the manifests only name: the test makes monsoon-auth (a
    fresh token) and monsoon-tls (certificates from tools/make_certs.sh for
    the names the clients dial, ps-<i>.ps, plus the loopback addresses they
    dial here), and a secret volume's items become files with its modes;
  - networking: every pod gets its own loopback address 127.a.b.x; a listen
    address 0.0.0.0:PORT becomes 127.a.b.x:PORT, and in an exec probe
    127.0.0.1 and localhost are the pod's own address. A pod of a
    StatefulSet, or of an Indexed Job with a subdomain, is named
    <pod>.<service>[.<namespace>[.svc[.cluster.local]]].

Processes (the default): the image's /usr/local/bin/<daemon> becomes the
built binary, every mountPath in the command, args and env (and in exec
probes) is rewritten to its directory, a name of a pod becomes its address,
and a --servers pattern (ps-{i}.ps:PORT with --num_shards) is expanded as
the daemons expand it, since nothing resolves those names here.

Containers (--containers): every pod is `podman run` of its container's
image, as the manifests name it (build it first: tools/k8s/images.sh), on
the host network, with the manifests' command (as the entrypoint), args and env
unchanged but for the listen and probe addresses above; its volumes are
mounted at their mountPaths (Secrets and the ConfigMap read-only, owned by
the pod's fsGroup as the kubelet makes them), the pod names resolve to the
pods' addresses (--add-host), and the container runs as the
securityContext's user and group with the fsGroup, a read-only root, no
capabilities and no new privileges. Probes are `podman exec` in the
container. With --gpu_check, the gpu overlay's worker pod runs in its
image and must exit 2 saying "no usable GPU" (checked on machines without
one).

Before running anything it checks the rendered objects: every pod non-root
(numeric user, group and fsGroup) with a read-only root, no privilege
escalation, every capability dropped, the runtime's seccomp profile and no
service account token; every daemon given --auth_token_file and, where any
daemon uses TLS, all three TLS flags; a NetworkPolicy admitting exactly the
shards' clients (workers, evaluator, finisher) to the shards, and a scraper
(chosen by namespace and pod labels) to the metrics port only. Then a whole
run: the shards' startup, readiness and liveness probes (gRPC probes with
tools/k8s/health_probe, exec probes as they are); a shard with TLS turns
away a plaintext client and its certificate holds the name the workers
dial; every daemon serves Prometheus metrics on its metrics port
(monsoon_build_info of its role and the process metrics; a worker's final
ones while it lingers, after which SIGTERM ends it); an evaluator stopped
by SIGTERM before the run's end (before the workers start) exits 143 and
its successor continues the curve; every worker exits 0 (in an elastic
run, whose config says `elastic: true`, the workers' Job is first scaled
as the Job controller scales an elastic Indexed Job: up to --num_workers,
whose new indices join the run, then down by one, whose pod is ended by
SIGTERM and leaves it; the finisher's metrics must then count every
example of every epoch trained and a join and a leave of each rank; in a
replicated run, whose shards run with --replicas, the last shard's pod is
SIGKILLed mid-run and replaced as its Job does, must copy its ranges back,
and no worker may lose an acknowledged update); then
the run ends by itself: the evaluator measures the final weights and exits 0, the finisher writes metrics.json on the results
claim and exits 0, and every shard writes its final checkpoint and exits 0
within a minute. A shard started again on that claim (a rerun that forgot
the old volumes) must exit 2 saying the run is finished. Last, shards on
fresh claims are stopped with SIGTERM within terminationGracePeriodSeconds,
each leaving its checkpoint, and a restarted one resumes from it. Every
pod's command line and exit code is logged.

  tests/k8s_manifests_test.py [--overlay=NAME | --overlay_dir=DIR |
      --rendered=FILE]
      [--bin_dir=bazel-bin] [--containers [--gpu_check]]

Under `bazel test` it finds the overlay and the binaries in its runfiles.
Skips (exit 0, with a message) where kubectl or openssl is absent.
"""

import argparse
import json
import os
import random
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

BINARIES = {
    "ps_server": "server/ps_server",
    "ps_worker": "worker/ps_worker",
    "ps_evaluator": "worker/ps_evaluator",
    "run_finisher": "tools/k8s/run_finisher",
}
# The role in monsoon_build_info of each daemon.
ROLES = {"ps_server": "shard", "ps_worker": "worker",
         "ps_evaluator": "evaluator", "run_finisher": "finisher"}
PODMAN = ["podman", "--runtime=runc", "--cgroup-manager=cgroupfs"]
PROBE = "health_probe"
# Where every daemon of the manifests serves its Prometheus metrics.
METRICS_PORT = 9464
WORKER_TIMEOUT_S = 240
# After the last worker: the evaluator's last point, the finisher's poll,
# and the shards' final checkpoints.
END_TIMEOUT_S = 90


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
        self.dns_name = None  # <pod>.<service> for a StatefulSet's pods
        self.localize = None  # text in the pod -> text here, from prepare()
        c = spec["containers"][0]
        self.daemon = os.path.basename((c.get("command") or [""])[0])
        self.container = None  # the container's name, with --image
        # A Job's failed pods it replaces (backoffLimit; 0 for other owners),
        # and how many it has replaced.
        self.backoff_limit = 0
        self.replaced = 0


class Cluster:
    def __init__(self, objects, bin_dir, probe, work_dir, containers=False):
        self.objects = objects
        self.bin_dir = bin_dir
        self.probe = probe
        self.work_dir = work_dir
        # False: local processes; True: podman run of each pod's image.
        self.containers = containers
        self.secrets = {}  # Secret name -> {key: bytes}, see make_secrets
        self.config_maps = {o["metadata"]["name"]: o.get("data", {})
                            for o in objects if o["kind"] == "ConfigMap"}
        self.pods = []
        self.hosts = {}  # DNS name -> loopback address
        # A random 127.x.y.0/24 per run, so that runs side by side (or a
        # process left over) do not collide on the manifests' fixed ports.
        self.prefix = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        self.next_ip = 10
        self.claims = {}  # PVC name -> directory (kept across restarts)
        self.claim_set = 0  # fresh_claims() starts another set
        self.started_containers = []  # every name given to `podman run`

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
            if kind == "StatefulSet":
                count = spec.get("replicas", 1)
            elif kind == "Deployment":
                count = spec.get("replicas", 1)
            else:
                count = spec.get("completions", 1)
                if spec.get("parallelism", 1) != count:
                    raise Failure(f"Job {name}: parallelism "
                                  f"{spec.get('parallelism', 1)} is not its "
                                  f"completions {count}: not every pod of "
                                  "the run would run at once")
            for i in range(count):
                self.pods.append(self.make_pod(o, i, services))

    def make_pod(self, o, i, services):
        """Pod `i` of the StatefulSet, Deployment or Job `o`."""
        kind, name = o["kind"], o["metadata"]["name"]
        spec = o["spec"]
        template = spec["template"]
        labels = dict(template.get("metadata", {}).get("labels", {}))
        grace = template["spec"].get("terminationGracePeriodSeconds", 30)
        indexed = kind == "Job" and spec.get("completionMode") == "Indexed"
        pod_labels = dict(labels)
        annotations = {}
        if kind == "StatefulSet":
            pod_name = f"{name}-{i}"
            pod_labels["apps.kubernetes.io/pod-index"] = str(i)
            pod_labels["statefulset.kubernetes.io/pod-name"] = pod_name
        elif indexed:
            # The pod's hostname is <job>-<index>.
            pod_name = f"{name}-{i}"
            annotations["batch.kubernetes.io/job-completion-index"] = str(i)
            pod_labels["batch.kubernetes.io/job-completion-index"] = str(i)
        else:
            pod_name = f"{name}-{i}"
        pod = Pod(pod_name, kind, name, template["spec"], pod_labels,
                  annotations, self._ip(), grace)
        if kind == "Job" and not indexed:
            pod.backoff_limit = spec.get("backoffLimit", 6)
        elif indexed and "backoffLimitPerIndex" in spec:
            pod.backoff_limit = spec["backoffLimitPerIndex"]
        service = None
        if kind == "StatefulSet":
            service = spec.get("serviceName", "")
            if service not in services:
                raise Failure(f"StatefulSet {name}: no Service "
                              f"'{service}' for serviceName")
        elif indexed and template["spec"].get("subdomain"):
            service = template["spec"]["subdomain"]
            if service not in services:
                raise Failure(f"Job {name}: no Service '{service}' "
                              "for its pods' subdomain")
        if service is not None:
            pod.dns_name = f"{pod_name}.{service}"
            for suffix in ("", ".default", ".default.svc",
                           ".default.svc.cluster.local"):
                self.hosts[f"{pod_name}.{service}{suffix}"] = pod.ip
            for claim in spec.get("volumeClaimTemplates", []):
                cname = f"{claim['metadata']['name']}-{pod_name}"
                pod.volume_dirs[claim["metadata"]["name"]] = \
                    self._claim(cname)
        return pod

    def scale_up(self, job, count):
        """What the Job controller does when an elastic Indexed Job's
        parallelism and completions are raised to `count`: the pods of the
        new indices (planned here; the caller starts them)."""
        o = next(x for x in self.objects
                 if x["kind"] == "Job" and x["metadata"]["name"] == job)
        services = {x["metadata"]["name"]: x for x in self.objects
                    if x["kind"] == "Service"}
        have = [p for p in self.pods if p.owner == job]
        added = [self.make_pod(o, i, services)
                 for i in range(len(have), count)]
        for pod in added:
            pod.cluster_tail = lambda lines, pod=pod: self.tail(pod, lines)
        self.pods.extend(added)
        return added

    def _claim(self, name):
        if name not in self.claims:
            path = os.path.join(self.work_dir, f"pvc{self.claim_set}", name)
            os.makedirs(path)
            self._writable(path)
            self.claims[name] = path
        return self.claims[name]

    def fresh_claims(self):
        """New, empty directories for every claim from now on (pods already
        prepared keep theirs until prepared again)."""
        self.claim_set += 1
        self.claims = {}
        for pod in self.pods:
            pod.argv = None
            pod.volume_dirs = {}
            spec = next(o["spec"] for o in self.objects
                        if o["metadata"]["name"] == pod.owner and
                        o["kind"] == pod.kind)
            for claim in spec.get("volumeClaimTemplates", []):
                pod.volume_dirs[claim["metadata"]["name"]] = self._claim(
                    f"{claim['metadata']['name']}-{pod.name}")

    def _writable(self, path):
        """A volume the pods may write, as the kubelet makes it for the
        pods' fsGroup (which every pod of the manifests shares)."""
        if not self.containers:
            return
        groups = {p.spec.get("securityContext", {}).get("fsGroup")
                  for p in self.pods} - {None}
        if len(groups) == 1:
            os.chown(path, 0, groups.pop())
            os.chmod(path, 0o2775)
        else:
            os.chmod(path, 0o1777)

    def make_secrets(self, make_certs):
        """The Secrets that tools/k8s/README.md has people make: monsoon-auth
        with a fresh token, and monsoon-tls from tools/make_certs.sh for the
        names the workers dial (ps-<i>.ps) and, since every name resolves to
        a loopback address here, those addresses."""
        shards = [p for p in self.pods if p.dns_name]
        tls_dir = os.path.join(self.work_dir, "certs")
        names = [p.dns_name for p in shards] + [p.ip for p in shards]
        result = subprocess.run(["bash", make_certs, tls_dir] + names,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise Failure(f"{make_certs} failed:\n{result.stderr}")
        tls = {}
        for key in ("ca.pem", "server.pem", "server.key", "client.pem",
                    "client.key"):
            with open(os.path.join(tls_dir, key), "rb") as f:
                tls[key] = f.read()
        self.secrets = {
            "monsoon-auth": {"token": (secrets.token_hex(32) + "\n").encode()},
            "monsoon-tls": tls,
        }

    def _secret_volume(self, pod, vname, source):
        name = source["secretName"]
        if name not in self.secrets:
            raise Failure(f"{pod.name}: volume {vname}: no Secret {name} (the "
                          f"test makes {', '.join(sorted(self.secrets))})")
        data = self.secrets[name]
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        path = os.path.join(self.work_dir, "secret", pod.name, vname)
        os.makedirs(path, exist_ok=True)
        for item in items:
            if item["key"] not in data:
                raise Failure(f"{pod.name}: volume {vname}: Secret {name} has "
                              f"no key {item['key']}")
            local = os.path.join(path, item["path"])
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "wb") as f:
                f.write(data[item["key"]])
            # The kubelet's default is 0644; it gives the files to the
            # pod's fsGroup.
            os.chmod(local, item.get("mode", source.get("defaultMode", 0o644)))
            group = pod.spec.get("securityContext", {}).get("fsGroup")
            if self.containers and group is not None:
                os.chown(local, 0, group)
        return path

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
                self._writable(path)
                pod.volume_dirs[vname] = path
            elif "secret" in volume:
                pod.volume_dirs[vname] = self._secret_volume(
                    pod, vname, volume["secret"])
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
        if "batch.kubernetes.io/job-completion-index" in pod.annotations:
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
        mounts = {m["mountPath"].rstrip("/"): pod.volume_dirs[m["name"]]
                  for m in c.get("volumeMounts", [])}
        pod.mounts = [(pod.volume_dirs[m["name"]], m["mountPath"],
                       bool(m.get("readOnly")))
                      for m in c.get("volumeMounts", [])]
        # One pass, longest first, whole path components only: a local
        # directory (under /tmp, say) is never rewritten again. A container
        # has its volumes at their mount paths: nothing to rewrite.
        mount_re = re.compile(
            r"(?<![\w./-])(" +
            "|".join(re.escape(m) for m in sorted(mounts, key=len,
                                                  reverse=True)) +
            r")(?=/|$|[^\w.-])") if mounts and not self.containers else None

        def localize(text, in_pod=False):
            if mount_re:
                text = mount_re.sub(lambda m: mounts[m.group(1)], text)
            text = re.sub(r"\b0\.0\.0\.0:", f"{pod.ip}:", text)
            if in_pod:  # a probe's exec: loopback is the pod's own address
                text = re.sub(r"(?<![\w.-])(127\.0\.0\.1|localhost):",
                              f"{pod.ip}:", text)
            if not self.containers:  # in a container, the names resolve
                for host in sorted(self.hosts, key=len, reverse=True):
                    text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?=:)",
                                  self.hosts[host], text)
            return text

        pod.localize = localize
        pod.in_container = self.containers

        argv = [expand(a, env) for a in c.get("command", []) + c.get("args", [])]
        if not argv:
            raise Failure(f"{pod.name}: no command (the image's entrypoint is "
                          "not emulated)")
        daemon = os.path.basename(argv[0])
        if daemon not in BINARIES:
            raise Failure(f"{pod.name}: command {argv[0]} is not a Monsoon daemon")
        if not self.containers:
            argv[0] = os.path.join(self.bin_dir, BINARIES[daemon])
            argv = expand_servers(argv)
        pod.argv = [argv[0]] + [localize(a) for a in argv[1:]]
        pod.env = {k: localize(v) for k, v in env.items()}

    def start(self, pod, suffix=""):
        if pod.argv is None:
            self.prepare(pod)
        pod.log_path = os.path.join(self.work_dir, f"{pod.name}{suffix}.log")
        shown_env = " ".join(f"{k}={v}" for k, v in sorted(pod.env.items()))
        if not self.containers:
            environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            environment.update(pod.env)
            argv = pod.argv
        else:
            argv = self.container_argv(pod, suffix)
            environment = dict(os.environ)
        image = pod.spec["containers"][0].get("image")
        log(f"start {pod.name} ({pod.kind} {pod.owner}, {pod.ip}"
            f"{', image ' + image if self.containers else ''}): "
            f"{shown_env + ' ' if shown_env else ''}{' '.join(pod.argv)}")
        pod.process = subprocess.Popen(
            argv, env=environment, stdout=open(pod.log_path, "w"),
            stderr=subprocess.STDOUT, start_new_session=True)

    def container_argv(self, pod, suffix):
        """`podman run` of the pod's image as the kubelet would run it: host
        network, the securityContext's user, groups and restrictions, the
        volumes at their mount paths, the pod names resolving to the pods'
        addresses."""
        spec = pod.spec
        c = spec["containers"][0]
        pod_sc = spec.get("securityContext", {})
        sc = c.get("securityContext", {})
        user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        pod.container = (f"monsoon-test-{self.prefix.replace('.', '-')}-"
                         f"{pod.name}{suffix}")
        self.started_containers.append(pod.container)
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        argv = PODMAN + [
            "run", "--rm", "--name", pod.container, "--network=host",
            # Explicit limits (the runtime's defaults may exceed what this
            # host lets it set): this process's own.
            f"--ulimit=nofile={nofile}:{nofile}", "--ulimit=nproc=4096:4096",
            "--pull=never"]
        if user is not None:
            argv.append(f"--user={user}:{group if group is not None else user}")
        if pod_sc.get("fsGroup") is not None:
            argv.append(f"--group-add={pod_sc['fsGroup']}")
        if sc.get("readOnlyRootFilesystem"):
            argv.append("--read-only")
        if sc.get("allowPrivilegeEscalation") is False:
            argv.append("--security-opt=no-new-privileges")
        for cap in sc.get("capabilities", {}).get("drop", []):
            argv.append(f"--cap-drop={cap}")
        for host, ip in sorted(self.hosts.items()):
            argv.append(f"--add-host={host}:{ip}")
        for key, value in sorted(pod.env.items()):
            argv += ["-e", f"{key}={value}"]
        for local, path, read_only in pod.mounts:
            argv += ["-v", f"{local}:{path}{':ro' if read_only else ''}"]
        argv += [f"--entrypoint={json.dumps(pod.argv[:1])}", c["image"]]
        return argv + pod.argv[1:]

    def exit_report(self, pod, lines=30):
        """How the pod ended: its exit code, its container's state (with
        --containers: the `podman run` client's exit is not always the
        container's), and the last lines of its log."""
        text = f"exit code {pod.process.returncode}"
        if pod.container is not None:
            state = subprocess.run(
                PODMAN + ["ps", "-a", "--filter", f"name={pod.container}",
                          "--format", "{{.Names}} {{.Status}}"],
                capture_output=True, text=True)
            text += (f", container: {state.stdout.strip() or 'gone'}"
                     f"{state.stderr.strip()}")
        return f"{text}\n{self.tail(pod, lines)}"

    def replace_failed(self, pod, what):
        """As a Job does with a pod that failed (restartPolicy Never): starts
        another, while its backoffLimit allows; logs why. False where the
        pod may not be replaced."""
        if pod.process.returncode == 0 or pod.replaced >= pod.backoff_limit:
            return False
        pod.replaced += 1
        log(f"{pod.name} failed {what}: {self.exit_report(pod)}")
        log(f"Job {pod.owner} replaces {pod.name} (replacement "
            f"{pod.replaced} of backoffLimit {pod.backoff_limit})")
        self.start(pod, suffix=f"-replaced{pod.replaced}")
        return True

    def tail(self, pod, lines=15):
        try:
            with open(pod.log_path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def probe_command(self, pod, probe, name):
        """The command line that runs `probe` here: health_probe for a gRPC
        probe, the exec command (which must run health_probe) localized."""
        if "grpc" in probe:
            cmd = [self.probe, f"--addr={pod.ip}:{probe['grpc']['port']}",
                   f"--timeout_s={probe.get('timeoutSeconds', 1)}"]
            if probe["grpc"].get("service"):
                cmd.append(f"--service={probe['grpc']['service']}")
            return cmd
        if "exec" in probe:
            command = probe["exec"].get("command", [])
            if not command or os.path.basename(command[0]) != PROBE:
                raise Failure(f"{pod.name}: {name} runs {command[:1]}, not "
                              f"{PROBE} (not emulated)")
            args = [pod.localize(a, in_pod=True) for a in command[1:]]
            if self.containers:
                return PODMAN + ["exec", pod.container, command[0]] + args
            return [self.probe] + args
        raise Failure(f"{pod.name}: {name} is neither a gRPC nor an exec probe")

    def run_probe(self, pod, probe, name):
        """Runs a probe as the kubelet would: a startup probe until it
        succeeds or periodSeconds * failureThreshold have passed (or the
        process has exited), the others once; each try is killed after
        timeoutSeconds and then counts as failed."""
        cmd = self.probe_command(pod, probe, name)
        timeout = probe.get("timeoutSeconds", 1)
        # A gRPC probe's deadline is health_probe's --timeout_s; its process
        # start, which the kubelet does not have, gets slack. An exec probe
        # is the command the kubelet itself would kill after timeoutSeconds.
        limit = timeout + 30 if "grpc" in probe else timeout
        budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
        deadline = time.monotonic() + (budget if name == "startupProbe" else 0)
        while True:
            try:
                result = subprocess.run(cmd, capture_output=True, text=True,
                                        timeout=limit)
            except subprocess.TimeoutExpired:
                result = subprocess.CompletedProcess(
                    cmd, 1, f"no answer within timeoutSeconds ({timeout})\n", "")
            if result.returncode == 0 or time.monotonic() >= deadline:
                break
            if pod.process.poll() is not None:
                raise Failure(f"{pod.name} exited with code "
                              f"{pod.process.returncode} before its {name} "
                              f"succeeded:\n{self.tail(pod)}")
            time.sleep(0.2)  # the kubelet's period, shortened
        log(f"{name} of {pod.name}: {' '.join(cmd)}: {result.stdout.strip()} "
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
        # Every container, also one whose `podman run` client has gone.
        if self.started_containers:
            subprocess.run(PODMAN + ["rm", "-f", "--ignore"] +
                           self.started_containers, capture_output=True)
        for pod in self.pods:
            if pod.process is not None and pod.process.poll() is None:
                pod.process.kill()
                pod.process.wait()


def expand_servers(argv):
    """A --servers pattern (HOST-{i}:PORT with --num_shards=N) as the daemons
    expand it (worker/client_flags.h), for processes that cannot resolve the
    names it makes."""
    flags = flags_of(argv[1:])
    servers = flags.get("servers", "")
    if "{i}" not in servers or "," in servers:
        return argv
    count = int(flags.get("num_shards", "0"))
    listed = ",".join(servers.replace("{i}", str(i)) for i in range(count))
    return [f"--servers={listed}" if a.startswith("--servers=") else a
            for a in argv]


def flags_of(argv):
    """{name: value} of the --name=value (or bare --name) arguments."""
    flags = {}
    for arg in argv:
        match = re.fullmatch(r"--?(\w+)(?:=(.*))?", arg, re.S)
        if match:
            flags[match.group(1)] = match.group(2) if match.group(2) is not None \
                else "true"
    return flags


def selects(selector, labels):
    if selector.get("matchExpressions"):
        raise Failure(f"selector {selector}: matchExpressions not understood")
    return all(labels.get(k) == v
               for k, v in selector.get("matchLabels", {}).items())


def check_security(objects):
    """The hardening of tools/k8s (tools/k8s/validate/policy.js checks the
    same, and more, on every overlay)."""
    templates = []  # (what, labels, pod spec, daemon or None)
    for o in objects:
        if o["kind"] not in ("StatefulSet", "Deployment", "Job"):
            continue
        template = o["spec"]["template"]
        what = f"{o['kind']} {o['metadata']['name']}"
        spec = template["spec"]
        labels = template.get("metadata", {}).get("labels", {})
        if spec.get("automountServiceAccountToken") is not False:
            raise Failure(f"{what}: automountServiceAccountToken is not false")
        pod_sc = spec.get("securityContext", {})
        for field in ("runAsUser", "runAsGroup", "fsGroup"):
            value = pod_sc.get(field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise Failure(f"{what}: securityContext.{field} is {value}, "
                              "wants a non-root number")
        if pod_sc.get("runAsNonRoot") is not True:
            raise Failure(f"{what}: runAsNonRoot is not true")
        if pod_sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            raise Failure(f"{what}: seccompProfile is not RuntimeDefault")
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            for field in ("runAsUser", "runAsGroup", "runAsNonRoot",
                          "seccompProfile"):
                if field in sc and sc[field] != pod_sc[field]:
                    raise Failure(f"{what}: container {c['name']} overrides "
                                  f"{field}")
            if sc.get("allowPrivilegeEscalation") is not False or \
                    sc.get("readOnlyRootFilesystem") is not True or \
                    "ALL" not in sc.get("capabilities", {}).get("drop", []):
                raise Failure(f"{what}: container {c['name']}: wants "
                              "allowPrivilegeEscalation false, "
                              "readOnlyRootFilesystem true and capabilities "
                              f"dropping ALL, has {sc}")
            daemon = os.path.basename((c.get("command") or [""])[0])
            templates.append((what, labels, c,
                              daemon if daemon in BINARIES else None))
    daemons = [t for t in templates if t[3]]
    tls = any(f in flags_of(c.get("args", [])) for _, _, c, _ in daemons
              for f in ("tls_ca", "tls_cert", "tls_key"))
    for what, _, c, daemon in daemons:
        flags = flags_of(c.get("args", []))
        wanted = ["auth_token_file"] + (["tls_ca", "tls_cert", "tls_key"]
                                        if tls else [])
        missing = [f"--{f}" for f in wanted if not flags.get(f)]
        if missing:
            raise Failure(f"{what}: {daemon} has no {', '.join(missing)}")
    log(f"every pod non-root with a read-only root; every daemon has "
        f"--auth_token_file{' and the TLS flags' if tls else ''} "
        f"(TLS {'on' if tls else 'off'})")
    # Exactly the workers and the evaluator may reach the shards (and, with
    # --replicas, the shards, which dial each other).
    shards = [t for t in daemons if t[3] == "ps_server"]
    replicated = any(int(flags_of(c.get("args", [])).get("replicas", "0")) > 0
                     for _, _, c, _ in shards)
    clients = [t for t in daemons if t[3] != "ps_server" or replicated]
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for what, labels, _, _ in shards:
        allowed = [(p, rule) for p in policies
                   if selects(p["spec"].get("podSelector", {}), labels)
                   for rule in p["spec"].get("ingress", [])]
        if not any(selects(p["spec"].get("podSelector", {}), labels)
                   for p in policies):
            raise Failure(f"{what}: no NetworkPolicy selects the shards")
        reached = set()
        for policy, rule in allowed:
            if is_scraper_rule(policy, rule):
                continue
            if not rule.get("from"):
                raise Failure(f"NetworkPolicy {policy['metadata']['name']}: "
                              "a rule admits every source")
            for peer in rule["from"]:
                if set(peer) != {"podSelector"}:
                    raise Failure(f"NetworkPolicy {policy['metadata']['name']}"
                                  f": admits {peer}, not only pods by label")
                matched = {t[0] for t in templates
                           if selects(peer["podSelector"], t[1])}
                if not matched or matched - {t[0] for t in clients}:
                    raise Failure(f"NetworkPolicy {policy['metadata']['name']}"
                                  f": admits {peer}, which selects "
                                  f"{sorted(matched) or 'nothing'}, not only "
                                  "workers and evaluators")
                reached |= matched
        if reached != {t[0] for t in clients}:
            raise Failure(f"{what}: the NetworkPolicies admit {sorted(reached)}"
                          f", not the workers and evaluators "
                          f"{sorted(t[0] for t in clients)}")
    # Every other pod takes no connections at all.
    for what, labels, _, daemon in templates:
        applying = [p for p in policies
                    if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                    and selects(p["spec"].get("podSelector", {}), labels)]
        if not applying:
            raise Failure(f"{what}: no NetworkPolicy restricts its ingress")
        if daemon != "ps_server" and any(
                not is_scraper_rule(p, rule)
                for p in applying for rule in p["spec"].get("ingress", [])):
            raise Failure(f"{what}: a NetworkPolicy admits connections to it")
    log(f"NetworkPolicy: only {sorted({t[0] for t in clients})} reach the "
        f"shards, and a scraper each pod's metrics port {METRICS_PORT}; "
        "nothing else reaches any pod")


def is_scraper_rule(policy, rule):
    """Whether `rule` is the rule for a Prometheus: then it must admit only
    pods chosen by a namespace label and a pod label, on the metrics port
    (a Failure otherwise)."""
    peers = rule.get("from") or []
    if not any("namespaceSelector" in peer for peer in peers):
        return False
    name = policy["metadata"]["name"]
    for peer in peers:
        if (set(peer) != {"namespaceSelector", "podSelector"} or
                not peer["namespaceSelector"].get("matchLabels") or
                not peer["podSelector"].get("matchLabels")):
            raise Failure(f"NetworkPolicy {name}: admits {peer}; a scraper "
                          "must be chosen by a namespace and a pod label")
    ports = rule.get("ports") or []
    if not ports or any(p.get("port") != METRICS_PORT or
                        p.get("protocol", "TCP") != "TCP" for p in ports):
        raise Failure(f"NetworkPolicy {name}: admits a scraper to {ports}, "
                      f"not only the metrics port {METRICS_PORT}")
    return True


def local_path(pod, path):
    """Where a path of the pod's args is here: its volume's directory (a
    local process's args already name it)."""
    if not pod.in_container:
        return path
    for local, mount, _ in sorted(pod.mounts, key=lambda m: -len(m[1])):
        mount = mount.rstrip("/")
        if path == mount or path.startswith(mount + "/"):
            return local + path[len(mount):]
    return path


def curve_points(pod):
    """(time_s, samples) of every point of the curve the evaluator pod
    wrote (its --curve_out, on its volume)."""
    path = local_path(pod, flags_of(pod.argv)["curve_out"])
    points = []
    with open(path) as f:
        for match in re.finditer(
                r"points \{(.*?)\n\}", f.read(), re.S):
            body = match.group(1)
            t = re.search(r"time_s: ([0-9.e+-]+)", body)
            n = re.search(r"samples: (\d+)", body)
            points.append((float(t.group(1)) if t else 0.0,
                           int(n.group(1)) if n else 0))
    return points


def scrape(cluster, pod):
    """GET /metrics on the pod's metrics port: Prometheus text with the
    pod's monsoon_build_info and the process metrics, or a Failure."""
    port = int(flags_of(pod.argv)["metrics_listen"].rsplit(":", 1)[1])
    url = f"http://{pod.ip}:{port}/metrics"
    # A daemon serves its metrics once it has started (the evaluator after
    # it has reached the shards): up to a minute. A Job's pod that failed
    # first is replaced, as Kubernetes would, and its failure logged.
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                text = answer.read().decode()
            break
        except OSError as e:
            if pod.process.poll() is not None:
                if cluster.replace_failed(pod, "before serving its metrics"):
                    deadline = time.monotonic() + 60
                    continue
                raise Failure(f"{pod.name}: no metrics at {url}: {e}; "
                              f"{cluster.exit_report(pod)}")
            if time.monotonic() > deadline:
                raise Failure(f"{pod.name}: no metrics at {url} within 60 s: "
                              f"{e}\n{cluster.tail(pod)}")
            time.sleep(0.2)
    role = ROLES[pod.daemon]
    info = [l for l in text.splitlines()
            if l.startswith("monsoon_build_info{")]
    if len(info) != 1 or f'role="{role}"' not in info[0] or \
            not info[0].endswith(" 1"):
        raise Failure(f"{pod.name}: {url} has no monsoon_build_info of role "
                      f"{role}: {info}")
    # The finisher has no figures of its own, only its build and process.
    families = ["process_resident_memory_bytes", "process_cpu_seconds_total"]
    if role != "finisher":
        families.append(f"monsoon_{role}_")
    for family in families:
        if f"\n{family}" not in "\n" + text:
            raise Failure(f"{pod.name}: {url} lacks {family}")
    log(f"metrics of {pod.name} at {url}: {info[0]}, "
        f"{sum(1 for l in text.splitlines() if l.startswith('monsoon_'))} "
        "monsoon_ samples")


def check_static(objects):
    kinds = {}
    for o in objects:
        kinds.setdefault(o["kind"], []).append(o)
    for kind in ("Service", "Job", "PodDisruptionBudget", "ConfigMap",
                 "PersistentVolumeClaim"):
        if kind not in kinds:
            raise Failure(f"no {kind} in the rendered manifests")
    for sts in kinds.get("StatefulSet", []):
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
    check_security(objects)


def check_tls(cluster, pod):
    """A shard with TLS turns away a plaintext client, and its certificate
    holds the name the workers dial in a cluster (<pod>.<service>), made as
    tools/k8s/README.md says."""
    flags = flags_of(pod.argv[1:])
    if not flags.get("tls_cert"):
        return
    port = flags["listen"].rsplit(":", 1)[1]
    plain = subprocess.run([cluster.probe, f"--addr={pod.ip}:{port}"],
                           capture_output=True, text=True, timeout=30)
    if plain.returncode == 0:
        raise Failure(f"{pod.name}: a plaintext client got an answer: "
                      f"{plain.stdout}")
    certs = os.path.join(cluster.work_dir, "certs")
    named = subprocess.run(
        [cluster.probe, f"--addr={pod.ip}:{port}", "--timeout_s=5",
         f"--tls_ca={certs}/ca.pem", f"--tls_cert={certs}/client.pem",
         f"--tls_key={certs}/client.key",
         f"--tls_server_name={pod.dns_name}"],
        capture_output=True, text=True, timeout=30)
    if named.returncode != 0:
        raise Failure(f"{pod.name}: no TLS answer under the name "
                      f"{pod.dns_name}: {named.stdout}{named.stderr}")
    log(f"{pod.name}: plaintext refused; TLS answers as {pod.dns_name}")


def wait_for(pod, text, timeout_s, lines=20):
    """Until `text` is in the pod's last lines; a Failure if the pod exits or
    the time is up first."""
    deadline = time.monotonic() + timeout_s
    while text not in pod.cluster_tail(lines):
        if pod.process.poll() is not None or time.monotonic() > deadline:
            raise Failure(f"{pod.name}: no '{text}' in its log "
                          f"(exit code {pod.process.poll()}):\n"
                          f"{pod.cluster_tail(30)}")
        time.sleep(0.2)


# Enough lines of a pod's log to read all of it.
WHOLE_LOG = 1 << 30


def wait_registered(shard, workers):
    """Until the shard's log says each worker pod's rank (its Job's
    completion index) registered."""
    for pod in workers:
        rank = pod.annotations["batch.kubernetes.io/job-completion-index"]
        wait_for(shard, f"rank {rank} registered", 120, WHOLE_LOG)


def is_elastic(cluster):
    """Whether the run's config (a ConfigMap's file) says elastic: true."""
    return any(re.search(r"^\s*elastic\s*:\s*true\b", str(text), re.M)
               for data in cluster.config_maps.values()
               for text in data.values())


def scale_workers(cluster, servers, workers):
    """An elastic run's workers' Job scaled as `kubectl patch job ps-worker
    -p '{"spec":{"parallelism":N,"completions":N}}'` scales it: once the
    first workers train, up to --num_workers (the Job controller starts the
    new indices, which join the run), then down by one (it deletes the
    highest index's pod: SIGTERM within its grace period, and the worker
    leaves the run). Returns the workers that go on, and the one removed."""
    most = int(flags_of(workers[0].argv).get("num_workers", "1"))
    if most <= len(workers):
        raise Failure(f"an elastic run whose workers' Job starts {len(workers)} "
                      f"of at most {most} ranks: no room to scale up")
    wait_registered(servers[0], workers)
    added = cluster.scale_up(workers[0].owner, most)
    for pod in added:
        cluster.start(pod)
    wait_registered(servers[0], added)
    log(f"scaled {workers[0].owner} from {len(workers)} to {most}: ranks "
        f"{len(workers)} to {most - 1} joined the run")
    removed = added[-1]
    time.sleep(0.5)  # a step or two of its own
    code = cluster.terminate(removed)
    text = cluster.tail(removed, WHOLE_LOG)
    if code != 128 + signal.SIGTERM or "stopped by signal" not in text:
        raise Failure(f"{removed.name}: exit code {code} after SIGTERM "
                      f"(scaled down mid-run), expected 143 and 'stopped by "
                      f"signal':\n{cluster.tail(removed, 30)}")
    log(f"scaled {workers[0].owner} down to {most - 1}: {removed.name} left "
        f"the run (exit code {code})")
    return workers + added[:-1], removed


def is_replicated(servers):
    """Whether the shards run with --replicas."""
    return any(int(flags_of(pod.argv).get("replicas", "0")) > 0
               for pod in servers)


def kill_shard(cluster, servers, workers):
    """A replicated run: SIGKILL the last shard's pod once the workers
    train (a lost node), and start another as its Job does; its ranges go
    on at their backups meanwhile, and the new pod copies them back and is
    their backup."""
    wait_registered(servers[0], workers)
    time.sleep(0.5)
    victim = servers[-1]
    victim.process.kill()
    victim.process.wait()
    log(f"killed {victim.name} (SIGKILL) mid-run")
    if not cluster.replace_failed(victim, "(SIGKILL mid-run)"):
        raise Failure(f"{victim.name}: its Job does not replace a failed pod")
    deadline = time.monotonic() + 120
    while cluster.tail(victim, WHOLE_LOG).count(
            "this process holds the backup of the range") < 2:
        if victim.process.poll() is not None or time.monotonic() > deadline:
            raise Failure(f"{victim.name}, started again: did not copy both "
                          f"its ranges back (exit code "
                          f"{victim.process.poll()}):\n{cluster.tail(victim, 30)}")
        time.sleep(0.2)
    log(f"{victim.name} started again, copied its ranges back from their "
        "backups and is their backup")
    return victim


def check_nothing_lost(cluster, workers, metrics):
    """No worker was told a shard no longer has an update it had
    acknowledged, and each followed the range to its backup."""
    for pod in workers:
        text = cluster.tail(pod, WHOLE_LOG)
        if ("no longer has" in text or
                "this client's calls go there from now on" not in text):
            raise Failure(f"{pod.name}: lost acknowledged updates, or never "
                          f"followed the range to its backup:\n"
                          f"{cluster.tail(pod, 30)}")
    if metrics.get("failovers", 0) < 1:
        raise Failure(f"replicated run: failovers {metrics.get('failovers')}, "
                      "expected at least 1 (the killed shard's range taken "
                      "over)")
    log(f"replicated run: {metrics['failovers']} failover(s), no worker lost "
        "an acknowledged update")


def check_elastic_metrics(cluster, metrics, ranks):
    """Every example of every epoch trained (shard 0's ledger), and every
    rank's join and leave counted."""
    config = next(text for data in cluster.config_maps.values()
                  for text in data.values() if "elastic" in str(text))
    epochs = int(re.search(r"^\s*epochs\s*:\s*(\d+)", config, re.M).group(1))
    batch = int(re.search(r"^\s*batch_size\s*:\s*(\d+)", config,
                          re.M).group(1))
    per_epoch = 60000 // batch * batch  # Fashion-MNIST's, in whole batches
    trained = metrics.get("examples_trained")
    if (metrics.get("elastic") is not True or trained != [per_epoch] * epochs
            or metrics.get("membership_changes", 0) < 2 * ranks):
        raise Failure(f"elastic run: examples_trained {trained}, expected "
                      f"{epochs} x {per_epoch}; membership_changes "
                      f"{metrics.get('membership_changes')}, expected at "
                      f"least {2 * ranks} (a join and a leave of each of "
                      f"{ranks} ranks); elastic {metrics.get('elastic')}")
    log(f"elastic run: every example of {epochs} epochs trained, "
        f"{metrics['membership_changes']} membership changes, "
        f"{metrics.get('data_shards_requeued')} data shards re-queued, "
        f"{metrics.get('examples_trained_twice')} examples trained twice")


def wait_exit(cluster, pod, deadline, what):
    """The pod's exit code, once it exits by itself before `deadline`."""
    try:
        code = pod.process.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise Failure(f"{pod.name} still running {what}:\n"
                      f"{cluster.tail(pod, 30)}")
    log(f"exit {pod.name}: code {code}")
    return code


def check_checkpoints(servers, wanted_all=True):
    """{pod name: checkpoint path}: each shard's own file on its volume."""
    found = {}
    for pod in servers:
        flags = flags_of(pod.argv)
        directory = local_path(pod, flags["checkpoint_dir"])
        index = flags["shard"]
        wanted = f"shard-{index}-of-{len(servers)}.ckpt"
        path = os.path.join(directory, wanted)
        if not os.path.isfile(path):
            raise Failure(f"{pod.name}: expected checkpoint {wanted} in its "
                          f"volume, found {sorted(os.listdir(directory))}")
        found[pod.name] = path
        log(f"{pod.name} left {wanted} ({os.path.getsize(path)} bytes)")
    return found


def check_gpu_worker(objects, cluster):
    """The gpu overlay's worker pod in its image (the GPU image), on a
    machine without a usable GPU: exit 2 saying so (the Job then fails at
    once)."""
    workers = [o for o in objects if o["kind"] == "Job" and
               os.path.basename(o["spec"]["template"]["spec"]["containers"][0]
                                .get("command", [""])[0]) == "ps_worker"]
    if not workers:
        raise Failure("the gpu overlay has no worker Job")
    job = workers[0]
    pod = Pod(f"{job['metadata']['name']}-gpu-0", "Job", job["metadata"]["name"],
              job["spec"]["template"]["spec"],
              dict(job["spec"]["template"]["metadata"].get("labels", {})),
              {"batch.kubernetes.io/job-completion-index": "0"},
              cluster._ip(), 30)
    cluster.config_maps.update({o["metadata"]["name"]: o.get("data", {})
                                for o in objects if o["kind"] == "ConfigMap"})
    cluster.start(pod)
    gpu_image = pod.spec["containers"][0]["image"]
    code = wait_exit(cluster, pod, time.monotonic() + 120,
                     "120 s after it started in the GPU image")
    text = cluster.tail(pod, 40)
    if code != 2 or "no usable GPU" not in text:
        raise Failure(f"{pod.name} in {gpu_image}: expected exit code 2 and "
                      f"'no usable GPU', got code {code}:\n{text}")
    line = [l for l in text.splitlines() if "no usable GPU" in l][0]
    log(f"{pod.name} in {gpu_image} without a GPU: exit 2: {line.strip()}")


def run(objects, bin_dir, probe, make_certs, containers=False,
        gpu_objects=None):
    check_static(objects)
    work_dir = tempfile.mkdtemp(prefix="monsoon-k8s-pods-")
    cluster = Cluster(objects, bin_dir, probe, work_dir, containers)
    cluster.plan()
    cluster.make_secrets(make_certs)
    for pod in cluster.pods:
        pod.cluster_tail = lambda lines, pod=pod: cluster.tail(pod, lines)
    by_daemon = {}
    for pod in cluster.pods:
        by_daemon.setdefault(pod.daemon, []).append(pod)
    servers = by_daemon.get("ps_server", [])
    workers = by_daemon.get("ps_worker", [])
    evaluators = by_daemon.get("ps_evaluator", [])
    finishers = by_daemon.get("run_finisher", [])
    if not servers or not workers:
        raise Failure("the manifests run no shards or no workers")
    try:
        if gpu_objects is not None:
            check_gpu_worker(gpu_objects, cluster)
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
                cluster.run_probe(pod, c[name], name)
            check_tls(cluster, pod)
        for pod in evaluators + finishers:
            cluster.start(pod)
        # A drained evaluator exits 143 before the run's end; the Job's next
        # one continues the curve. Before any worker starts, so that the
        # run cannot have ended yet.
        curves = {}
        for pod in evaluators:
            wait_for(pod, "eval: ", 120)
            code = cluster.terminate(pod)
            if code != 128 + signal.SIGTERM:
                raise Failure(f"{pod.name}: exit code {code} after SIGTERM "
                              "mid-run, expected 143 (so that its Job starts "
                              f"another)\n{cluster.tail(pod, 30)}")
            curves[pod.name] = curve_points(pod)
            cluster.start(pod, suffix="-restarted")
            wait_for(pod, "continuing the curve", 60)
            log(f"restarted {pod.name}: continues a curve of "
                f"{len(curves[pod.name])} points")
        for pod in workers:
            cluster.start(pod)
        elastic = is_elastic(cluster)
        if elastic:
            workers, removed = scale_workers(cluster, servers, workers)
        replicated = is_replicated(servers)
        if replicated:
            kill_shard(cluster, servers, workers)
        # Every daemon's metrics, as a Prometheus in the cluster would scrape
        # them: the shards, the evaluator and the finisher while they serve,
        # each worker once it has trained and serves its final figures
        # (--metrics_linger_s), after which SIGTERM ends it.
        for pod in servers + evaluators + finishers:
            scrape(cluster, pod)
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        failed = []
        for pod in workers:
            while ("serving the final metrics" not in cluster.tail(pod, 5) and
                   pod.process.poll() is None and time.monotonic() < deadline):
                time.sleep(0.2)
            if pod.process.poll() is None and time.monotonic() < deadline:
                scrape(cluster, pod)
                pod.process.send_signal(signal.SIGTERM)
            code = wait_exit(cluster, pod, deadline,
                             f"after {WORKER_TIMEOUT_S} s")
            if code != 0:
                failed.append(f"{pod.name} exited with code {code}:\n"
                              f"{cluster.tail(pod)}")
        if failed:
            raise Failure("\n".join(failed))
        # The run ends by itself: the evaluator's final point, the
        # finisher's metrics, the shards' final checkpoints.
        deadline = time.monotonic() + END_TIMEOUT_S
        for pod in evaluators + finishers + servers:
            code = wait_exit(cluster, pod, deadline,
                             f"{END_TIMEOUT_S} s after the last worker")
            if code != 0:
                raise Failure(f"{pod.name}: exit code {code} at the run's "
                              f"end\n{cluster.tail(pod, 30)}")
        for pod in evaluators:
            after = curve_points(pod)
            curve = curves[pod.name]
            times = [t for t, _ in after]
            with open(local_path(pod, flags_of(pod.argv)["curve_out"])) as f:
                final = "run_finished: true" in f.read()
            if (len(after) <= len(curve) or after[:len(curve)] != curve or
                    times != sorted(times) or not final):
                raise Failure(f"{pod.name}: the curve went from {len(curve)} "
                              f"points to {len(after)}, final: {final} "
                              "(expected the same points and more, times "
                              "not going back, and run_finished)")
            log(f"{pod.name} continued its curve to {len(after)} points, the "
                "last of the final weights")
        for pod in finishers:
            path = local_path(pod, flags_of(pod.argv)["metrics_out"])
            try:
                with open(path) as f:
                    metrics = json.load(f)
            except (OSError, ValueError) as e:
                raise Failure(f"{pod.name}: no metrics JSON at {path}: {e}")
            missing = [k for k in ("mode", "servers", "workers", "samples",
                                   "samples_per_s", "final_test_accuracy",
                                   "bytes_pushed", "bytes_pulled", "staleness",
                                   "curve") if k not in metrics]
            if (missing or metrics["servers"] != len(servers) or
                    metrics["workers"] != len(workers) or
                    metrics["samples"] <= 0 or metrics["samples_per_s"] <= 0
                    or not metrics["curve"]):
                raise Failure(f"{pod.name}: {path} lacks {missing} or has "
                              f"wrong figures: {json.dumps(metrics)[:400]}")
            log(f"{pod.name} wrote metrics.json: {metrics['servers']} shards, "
                f"{metrics['workers']} workers, {metrics['samples']} samples, "
                f"{metrics['samples_per_s']:.0f} samples/s, final test "
                f"accuracy {metrics['final_test_accuracy']:.4f}, "
                f"{len(metrics['curve'])} curve points")
            if elastic:
                check_elastic_metrics(cluster, metrics, len(workers) + 1)
            if replicated:
                check_nothing_lost(cluster, workers, metrics)
        check_checkpoints(servers)
        # A rerun that forgot the old volumes: the shard refuses the finished
        # run's checkpoint, with what to do.
        pod = servers[0]
        cluster.start(pod, suffix="-rerun")
        code = wait_exit(cluster, pod, time.monotonic() + 60,
                         "60 s after it started on a finished run's volume")
        text = cluster.tail(pod, 20)
        if code != 2 or "final checkpoint of a finished run" not in text:
            raise Failure(f"{pod.name} on a finished run's checkpoints: exit "
                          f"code {code}, expected 2 and 'final checkpoint of a "
                          f"finished run':\n{text}")
        log(f"{pod.name} on the finished run's volume refused to resume: "
            f"exit 2")
        # SIGTERM on fresh volumes: every shard checkpoints within its grace
        # period, and a restarted one resumes from its file.
        cluster.fresh_claims()
        for pod in servers:
            cluster.start(pod, suffix="-sigterm")
        for pod in servers:
            cluster.run_probe(pod, pod.spec["containers"][0]["startupProbe"],
                              "startupProbe")
        for pod in servers:
            code = cluster.terminate(pod)
            if code != 0:
                raise Failure(f"{pod.name}: exit code {code} after SIGTERM\n"
                              f"{cluster.tail(pod)}")
        check_checkpoints(servers)
        pod = servers[0]
        cluster.start(pod, suffix="-resumed")
        cluster.run_probe(pod, pod.spec["containers"][0]["startupProbe"],
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
    if containers:
        # Files the containers wrote belong to the pods' user.
        subprocess.run(["chmod", "-R", "u+rwX", work_dir], capture_output=True)
    shutil.rmtree(work_dir, ignore_errors=True)
    return [f"{p.name} {p.replaced}x" for p in cluster.pods if p.replaced]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlay_dir")
    parser.add_argument("--overlay", default="cpu-small",
                        help="the overlay under tools/k8s/overlays to run "
                        "(without --overlay_dir)")
    parser.add_argument("--rendered", help="already rendered YAML")
    parser.add_argument("--bin_dir")
    parser.add_argument("--probe")
    parser.add_argument("--make_certs", help="tools/make_certs.sh")
    parser.add_argument("--containers", action="store_true",
                        help="run every pod as a podman container of the "
                        "image its manifest names, not as a local process")
    parser.add_argument("--gpu_check", action="store_true",
                        help="with --containers: also run the gpu overlay's "
                        "worker in its image, which must exit 2 saying there "
                        "is no usable GPU (on a machine without one)")
    args = parser.parse_args()
    runfiles = os.environ.get("TEST_SRCDIR")
    if runfiles:
        root = os.path.join(runfiles, os.environ.get("TEST_WORKSPACE", "__main__"))
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bin_dir = args.bin_dir or (root if runfiles else os.path.join(root, "bazel-bin"))
    probe = args.probe or os.path.join(bin_dir, "tools/k8s/health_probe")
    # In the runfiles where a BUILD file puts it there; else beside the
    # source of this file (runfiles link to the source tree).
    make_certs = args.make_certs
    for candidate in (os.path.join(root, "tools/make_certs.sh"),
                      os.path.join(os.path.dirname(os.path.dirname(
                          os.path.realpath(__file__))), "tools/make_certs.sh")):
        if make_certs is None and os.path.isfile(candidate):
            make_certs = candidate
    if make_certs is None:
        log("FAILED: tools/make_certs.sh not found (give --make_certs)")
        return 1
    if shutil.which("openssl") is None:
        print("SKIPPED: openssl is not installed; no certificates for the "
              "manifests' TLS Secret")
        return 0
    if args.rendered:
        with open(args.rendered) as f:
            text = f.read()
    else:
        if shutil.which("kubectl") is None:
            print("SKIPPED: kubectl is not installed; the manifests were not "
                  "rendered or run")
            return 0
        overlay = args.overlay_dir or os.path.join(
            root, "tools/k8s/overlays", args.overlay)
        text = render(overlay)
    objects = [o for o in yaml.safe_load_all(text) if o]
    gpu_objects = None
    if args.gpu_check:
        if not args.containers:
            log("FAILED: --gpu_check needs --containers")
            return 1
        gpu_objects = [o for o in yaml.safe_load_all(render(os.path.join(
            root, "tools/k8s/overlays/gpu"))) if o]
    started = time.monotonic()
    try:
        replaced = run(objects, bin_dir, probe, make_certs, args.containers,
                       gpu_objects)
    except Failure as failure:
        log(f"FAILED: {failure}")
        return 1
    log(f"PASSED in {time.monotonic() - started:.1f} s" +
        (f" (failed pods replaced by their Jobs: {', '.join(replaced)}; "
         "see above)" if replaced else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
