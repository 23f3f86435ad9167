// Security checks of rendered Monsoon manifests, the rules that the API's
// types cannot express (tools/k8s/validate/check.sh runs it on every overlay
// and on the broken fixtures):
//   - every pod: automountServiceAccountToken false; every container runs as
//     a numeric non-root user and group (runAsNonRoot), with an fsGroup, the
//     runtime's seccomp profile, a read-only root filesystem, no privilege
//     escalation and every capability dropped; a writable volume at /tmp and
//     wherever a daemon writes (--checkpoint_dir, --curve_out, ...); Secret
//     files no more than 0440; nothing from the host;
//   - every daemon (ps_server, ps_worker, ps_evaluator) reads the run's token
//     from a Secret (--auth_token_file); where any daemon uses TLS, all do,
//     with mutual TLS (shards: server certificate and CA; workers and
//     evaluators: CA and client certificate), every file from a Secret;
//     shards listen on all addresses, and with TLS their probes run
//     health_probe with the TLS flags (the kubelet's gRPC probe cannot);
//   - NetworkPolicies: every pod of the render has its ingress restricted;
//     the shards admit only pods that the workers' and evaluators' templates
//     match (and no other pod of the render), on the port they listen on;
//     the other pods admit nothing but a scraper; a scraper (a peer with a
//     namespaceSelector) must be chosen by both a namespace label and a pod
//     label, and reaches only the metrics port of a daemon that serves
//     metrics on all addresses (--metrics_listen=0.0.0.0:PORT).
//   - the run's objects: every pod template and every claim (also a
//     StatefulSet's volumeClaimTemplates) carries the label
//     app.kubernetes.io/part-of: monsoon, by which the README's commands
//     list the pods and delete the claims; every container's image has a
//     pinned tag (not latest) or a digest, with imagePullPolicy
//     IfNotPresent; the counts agree: the shards' and the workers' Jobs
//     run completions = parallelism pods, and every daemon's --num_shards,
//     --servers and --num_workers say the same counts (a shard's --servers
//     too, with --replicas, whose shards are then also the shards'
//     clients; in an elastic run, whose config says `elastic: true`,
//     --num_workers is the most ranks: the workers' Job starts at most that
//     many).
// Usage: node policy.js rendered.yaml. Prints one line per violation and
// exits 1 if there is any.
"use strict";
const fs = require("fs");
const path = require("path");
const YAML = require("yaml");

const DAEMONS = ["ps_server", "ps_worker", "ps_evaluator", "run_finisher"];
const RUN_LABEL = "app.kubernetes.io/part-of";
const RUN_NAME = "monsoon";
const PROBE = "health_probe";
// Flags whose value a daemon writes: a directory, or a file in one.
const WRITES = { checkpoint_dir: "dir", curve_out: "file", report_out: "file",
  port_file: "file", metrics_out: "file" };

const input = process.argv[2];
const objects = YAML.parseAllDocuments(fs.readFileSync(input, "utf8"))
  .map((doc) => doc.toJS()).filter((o) => o != null);
const errors = [];
const fail = (where, message) => errors.push(`${where}: ${message}`);

// Every pod template: {where, kind, labels, spec, claims}.
const pods = [];
for (const o of objects) {
  const where = `${o.kind} ${(o.metadata && o.metadata.name) || "?"}`;
  let template = null;
  if (o.kind === "Pod") template = { metadata: o.metadata, spec: o.spec };
  else if (["Deployment", "StatefulSet", "Job", "ReplicaSet", "DaemonSet",
    "ReplicationController"].includes(o.kind)) template = o.spec && o.spec.template;
  else if (o.kind === "CronJob") {
    template = o.spec && o.spec.jobTemplate && o.spec.jobTemplate.spec &&
      o.spec.jobTemplate.spec.template;
  }
  if (!template || !template.spec) continue;
  const claims = o.kind === "StatefulSet"
    ? (o.spec.volumeClaimTemplates || []).map((c) => c.metadata.name) : [];
  pods.push({ where, kind: o.kind, spec: template.spec, claims, object: o,
    labels: (template.metadata && template.metadata.labels) || {} });
}

// Labels: the README lists the run's pods, and deletes its claims, by
// app.kubernetes.io/part-of=monsoon.
function checkRunLabels() {
  for (const pod of pods) {
    if (pod.labels[RUN_LABEL] !== RUN_NAME) {
      fail(pod.where, `pod template lacks the label ${RUN_LABEL}: ${RUN_NAME} ` +
        "(kubectl get pods -l and the NetworkPolicies find the run's pods by it)");
    }
  }
  const claims = objects.filter((o) => o.kind === "PersistentVolumeClaim")
    .map((o) => [`PersistentVolumeClaim ${o.metadata.name}`, o.metadata]);
  for (const o of objects.filter((o) => o.kind === "StatefulSet")) {
    for (const t of (o.spec && o.spec.volumeClaimTemplates) || []) {
      claims.push([`StatefulSet ${o.metadata.name} volumeClaimTemplate ` +
        `${t.metadata.name}`, t.metadata]);
    }
  }
  for (const [where, metadata] of claims) {
    if (((metadata && metadata.labels) || {})[RUN_LABEL] !== RUN_NAME) {
      fail(where, `lacks the label ${RUN_LABEL}: ${RUN_NAME} (the teardown ` +
        "deletes the run's claims by it; one left behind holds a finished " +
        "run's checkpoints)");
    }
  }
}

// Images: a pinned tag or a digest, pulled only when the node lacks it.
function checkImages() {
  for (const pod of pods) {
    for (const c of (pod.spec.initContainers || []).concat(pod.spec.containers || [])) {
      const where = `${pod.where} container ${c.name}`;
      const image = String(c.image || "");
      const name = image.split("@")[0];
      const slash = name.lastIndexOf("/");
      const colon = name.lastIndexOf(":");
      const tag = colon > slash ? name.slice(colon + 1) : "";
      if (!image.includes("@") && (tag === "" || tag === "latest")) {
        fail(where, `image ${image || "(none)"} is not pinned: give a tag ` +
          "other than latest (kustomize images: newTag) or a digest");
      }
      if (c.imagePullPolicy !== "IfNotPresent") {
        fail(where, `imagePullPolicy is ${c.imagePullPolicy || "unset"}; ` +
          "wants IfNotPresent (a pinned tag never changes)");
      }
    }
  }
}

// The shards' addresses a client's flags name: its --servers list, or
// --num_shards of them for a {i} pattern.
function serverCount(flags) {
  const servers = (flags.servers || "").split(",").filter((s) => s.trim());
  if (servers.length === 1 && servers[0].includes("{i}")) {
    return Number(flags.num_shards || 0);
  }
  return servers.length;
}

// Whether the run's config (ConfigMap monsoon-config) is elastic: then
// --num_workers is the most ranks, and the workers' Job may start fewer.
function elasticRun() {
  return objects.some((o) => o.kind === "ConfigMap" &&
    /^monsoon-config/.test((o.metadata || {}).name || "") &&
    Object.values(o.data || {}).some((text) =>
      /^\s*elastic\s*:\s*true\b/m.test(String(text))));
}

// The counts: every place that names the shard or worker count agrees.
function checkCounts(daemons) {
  const elastic = elasticRun();
  const jobOf = (daemon) => {
    const d = daemons.find((x) => x.daemon === daemon);
    return d ? d.pod : null;
  };
  const podCount = (pod) => {
    const spec = pod.object.spec || {};
    if (pod.kind === "StatefulSet") return spec.replicas === undefined ? 1 : spec.replicas;
    if (pod.kind === "Job") {
      const completions = spec.completions === undefined ? 1 : spec.completions;
      const parallelism = spec.parallelism === undefined ? 1 : spec.parallelism;
      if (completions !== parallelism) {
        fail(pod.where, `counts disagree: completions ${completions} but ` +
          `parallelism ${parallelism} (every index runs at once)`);
      }
      return completions;
    }
    return null;
  };
  const shardPod = jobOf("ps_server");
  const workerPod = jobOf("ps_worker");
  const shards = shardPod ? podCount(shardPod) : null;
  const workers = workerPod ? podCount(workerPod) : null;
  for (const d of daemons) {
    const said = [];
    if (d.daemon === "ps_server") {
      said.push(["--num_shards", Number(d.flags.num_shards || 1), shards]);
      said.push(["--num_workers", Number(d.flags.num_workers || 1), workers]);
      if (Number(d.flags.replicas || 0) > 0) {
        said.push(["--servers", serverCount(d.flags), shards]);
      }
    } else {
      said.push(["--servers", serverCount(d.flags), shards]);
      if (d.daemon === "ps_worker") {
        said.push(["--num_workers", Number(d.flags.num_workers || 1), workers]);
      }
    }
    for (const [flag, value, wanted] of said) {
      if (elastic && flag === "--num_workers" && wanted !== null &&
          wanted >= 1 && wanted <= value) {
        continue;  // the Job starts `wanted` of the run's `value` ranks
      }
      if (wanted !== null && value !== wanted) {
        fail(d.where, `counts disagree: ${flag} says ${value}, but ` +
          `${flag === "--num_workers" ? workerPod.where : shardPod.where} ` +
          `runs ${wanted} (set the counts in the overlay's counts.yaml, ` +
          "with components/counts)");
      }
    }
  }
}

// --name=value flags and MONSOON_NAME env values of a container (a flag
// wins, as in common/flag_env).
function flagsOf(c) {
  const flags = {};
  for (const v of c.env || []) {
    const m = /^MONSOON_([A-Z0-9_]+)$/.exec(v.name);
    if (m && typeof v.value === "string") flags[m[1].toLowerCase()] = v.value;
  }
  for (const arg of (c.command || []).slice(1).concat(c.args || [])) {
    const m = /^--?([A-Za-z0-9_]+)(?:=(.*))?$/s.exec(String(arg));
    if (m) flags[m[1]] = m[2] === undefined ? "true" : m[2];
  }
  return flags;
}

function daemonOf(c) {
  const argv0 = (c.command && c.command[0]) || "";
  const name = path.posix.basename(String(argv0));
  return DAEMONS.includes(name) ? name : null;
}

// The volume mounted at the longest mountPath that holds `file`.
function mountOf(pod, c, file) {
  let best = null;
  for (const m of c.volumeMounts || []) {
    const dir = m.mountPath.replace(/\/+$/, "");
    if ((file === dir || file.startsWith(dir + "/")) &&
        (!best || dir.length > best.mount.mountPath.length)) {
      const volume = (pod.spec.volumes || []).find((v) => v.name === m.name) ||
        (pod.claims.includes(m.name) ? { name: m.name, persistentVolumeClaim: {} } : null);
      best = { mount: m, volume };
    }
  }
  return best;
}

const isUser = (n) => Number.isInteger(n) && n > 0;

function checkPod(pod) {
  const spec = pod.spec;
  if (spec.automountServiceAccountToken !== false) {
    fail(pod.where, "automountServiceAccountToken is not false (the daemons " +
      "never call the API server)");
  }
  for (const field of ["hostNetwork", "hostPID", "hostIPC"]) {
    if (spec[field]) fail(pod.where, `${field} is set`);
  }
  const podSc = spec.securityContext || {};
  if (!isUser(podSc.fsGroup)) {
    fail(pod.where, "no non-zero securityContext.fsGroup (the Secrets' " +
      "0440 files and the volumes must belong to the pod's group)");
  }
  for (const volume of spec.volumes || []) {
    if (volume.hostPath) fail(pod.where, `volume ${volume.name} is a hostPath`);
    if (volume.secret) {
      const modes = [["defaultMode", volume.secret.defaultMode]].concat(
        (volume.secret.items || []).filter((i) => i.mode !== undefined)
          .map((i) => [`mode of ${i.key}`, i.mode]));
      for (const [what, mode] of modes) {
        // Unset, Kubernetes uses 0644: readable by every user.
        if (!Number.isInteger(mode) || (mode & ~0o440) !== 0) {
          fail(pod.where, `Secret volume ${volume.name}: ${what} is ` +
            `${mode === undefined ? "unset (0644)" : "0" + Number(mode).toString(8)}` +
            ", wants at most 0440 (owner and group read)");
        }
      }
    }
  }
  const containers = (spec.initContainers || []).concat(spec.containers || []);
  for (const c of containers) {
    const where = `${pod.where} container ${c.name}`;
    const sc = c.securityContext || {};
    const effective = (field) => (sc[field] !== undefined ? sc[field] : podSc[field]);
    if (effective("runAsNonRoot") !== true) fail(where, "runAsNonRoot is not true");
    if (effective("runAsUser") === 0) fail(where, "runs as root (runAsUser 0)");
    else if (!isUser(effective("runAsUser"))) fail(where, "no numeric runAsUser");
    if (effective("runAsGroup") === 0) fail(where, "runs as group root (runAsGroup 0)");
    else if (!isUser(effective("runAsGroup"))) fail(where, "no numeric runAsGroup");
    const seccomp = effective("seccompProfile");
    if (!seccomp || seccomp.type !== "RuntimeDefault") {
      fail(where, "seccompProfile is not RuntimeDefault");
    }
    if (sc.allowPrivilegeEscalation !== false) {
      fail(where, "allowPrivilegeEscalation is not false");
    }
    if (sc.readOnlyRootFilesystem !== true) {
      fail(where, "readOnlyRootFilesystem is not true");
    }
    if (sc.privileged) fail(where, "privileged");
    const caps = sc.capabilities || {};
    if (!(caps.drop || []).includes("ALL")) fail(where, "capabilities do not drop ALL");
    if ((caps.add || []).length > 0) fail(where, `adds capabilities ${caps.add}`);
    const writable = (dir) => {
      const found = mountOf(pod, c, dir);
      return found && found.volume && !found.mount.readOnly &&
        (found.volume.emptyDir || found.volume.persistentVolumeClaim ||
         found.volume.ephemeral);
    };
    if (!writable("/tmp")) fail(where, "no writable volume at /tmp (the root is read-only)");
    const daemon = daemonOf(c);
    if (daemon) {
      const flags = flagsOf(c);
      for (const [flag, kind] of Object.entries(WRITES)) {
        if (!flags[flag]) continue;
        const dir = kind === "dir" ? flags[flag] : path.posix.dirname(flags[flag]);
        if (!writable(dir)) {
          fail(where, `--${flag}=${flags[flag]} is not on a writable volume ` +
            "(the root is read-only)");
        }
      }
    }
  }
}

// Daemons and their credentials. TLS is on when any daemon has a TLS flag.
function checkDaemons() {
  const daemons = [];
  for (const pod of pods) {
    for (const c of pod.spec.containers || []) {
      const daemon = daemonOf(c);
      if (daemon) daemons.push({ pod, c, daemon, flags: flagsOf(c),
        where: `${pod.where} container ${c.name} (${daemon})` });
    }
  }
  const tls = daemons.some((d) => d.flags.tls_ca || d.flags.tls_cert || d.flags.tls_key);
  const fromSecret = (d, flag) => {
    const file = d.flags[flag];
    if (!file) {
      fail(d.where, `no --${flag}`);
      return;
    }
    const found = mountOf(d.pod, d.c, file);
    if (!found || !found.volume || !found.volume.secret) {
      fail(d.where, `--${flag}=${file} is not in a mounted Secret`);
    }
  };
  for (const d of daemons) {
    fromSecret(d, "auth_token_file");
    if (tls) ["tls_ca", "tls_cert", "tls_key"].forEach((f) => fromSecret(d, f));
    if (d.daemon === "ps_server") checkServer(d, tls);
  }
  return daemons;
}

function listenPort(d) {
  const m = /^(.*):(\d+)$/.exec(d.flags.listen || "");
  return m ? { host: m[1], port: Number(m[2]) } : null;
}

function checkServer(d, tls) {
  const listen = listenPort(d);
  if (!listen || !["0.0.0.0", "[::]"].includes(listen.host)) {
    fail(d.where, `--listen=${d.flags.listen || "(default 127.0.0.1:5000)"}: ` +
      "other pods cannot reach it; give --listen=0.0.0.0:PORT");
    return;
  }
  for (const name of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const probe = d.c[name];
    if (!probe) {
      fail(d.where, `no ${name}`);
      continue;
    }
    if (probe.grpc) {
      if (tls) {
        fail(d.where, `${name} is a gRPC probe, which cannot speak TLS: ` +
          "run health_probe with the TLS flags (an exec probe)");
      } else if (probe.grpc.port !== listen.port) {
        fail(d.where, `${name} probes port ${probe.grpc.port}, not ${listen.port}`);
      }
      continue;
    }
    const command = (probe.exec && probe.exec.command) || [];
    if (path.posix.basename(String(command[0] || "")) !== PROBE) {
      fail(d.where, `${name} neither runs ${PROBE} nor is a gRPC probe`);
      continue;
    }
    const flags = flagsOf({ command });
    const addr = /^(127\.0\.0\.1|localhost):(\d+)$/.exec(flags.addr || "");
    if (!addr || Number(addr[2]) !== listen.port) {
      fail(d.where, `${name}: --addr=${flags.addr} is not the loopback ` +
        `address and port ${listen.port}`);
    }
    if (tls) {
      for (const flag of ["tls_ca", "tls_cert", "tls_key"]) {
        const file = flags[flag];
        const found = file && mountOf(d.pod, d.c, file);
        if (!found || !found.volume || !found.volume.secret) {
          fail(d.where, `${name}: ${file ? `--${flag}=${file} is not in a ` +
            "mounted Secret" : `no --${flag} (the shard requires mutual TLS)`}`);
        }
      }
    }
  }
}

// Whether a label selector (matchLabels only) selects these labels.
function selects(selector, labels, where) {
  if (selector.matchExpressions && selector.matchExpressions.length) {
    fail(where, "matchExpressions in a selector: not understood by this check");
    return false;
  }
  return Object.entries(selector.matchLabels || {})
    .every(([k, v]) => labels[k] === v);
}

// The port of a daemon's --metrics_listen, if it serves metrics; a daemon
// whose metrics listen on loopback only cannot be scraped.
function metricsPort(d) {
  if (!d.flags.metrics_listen) return null;
  const m = /^(.*):(\d+)$/.exec(d.flags.metrics_listen);
  if (!m || !["0.0.0.0", "[::]"].includes(m[1])) {
    fail(d.where, `--metrics_listen=${d.flags.metrics_listen}: a Prometheus ` +
      "in another pod cannot reach it; give --metrics_listen=0.0.0.0:PORT");
    return null;
  }
  return Number(m[2]);
}

// A rule for a Prometheus: every peer selects pods by labels within
// namespaces selected by labels (never everything), and every port is the
// pod's metrics port.
function checkScraperRule(where, rule, port) {
  if (port === null) {
    fail(where, "admits a scraper to a pod whose daemon serves no metrics");
    return;
  }
  for (const peer of rule.from) {
    const namespaces = (peer.namespaceSelector || {}).matchLabels || {};
    const scraper = (peer.podSelector || {}).matchLabels || {};
    if (peer.ipBlock || Object.keys(namespaces).length === 0 ||
        Object.keys(scraper).length === 0) {
      fail(where, `admits ${JSON.stringify(peer)}: a scraper must be chosen ` +
        "by both a namespace label and a pod label");
    }
  }
  if (!rule.ports || rule.ports.length === 0) {
    fail(where, "an ingress rule without ports admits every port");
  }
  for (const p of rule.ports || []) {
    if ((p.protocol || "TCP") !== "TCP" || p.endPort !== undefined ||
        p.port !== port) {
      fail(where, `admits a scraper to port ${JSON.stringify(p)}; only the ` +
        `metrics port ${port} is for it`);
    }
  }
}

function checkNetworkPolicies(daemons) {
  const shards = daemons.filter((d) => d.daemon === "ps_server");
  if (shards.length === 0) return;
  const podMetrics = new Map();
  for (const d of daemons) podMetrics.set(d.pod, metricsPort(d));
  // With --replicas the shards dial each other: they are clients too.
  const replicated = shards.some((d) => Number(d.flags.replicas || 0) > 0);
  const clients = new Set(daemons.filter((d) =>
    d.daemon !== "ps_server" || replicated).map((d) => d.pod));
  const shardPods = new Set(shards.map((d) => d.pod));
  const ports = new Set(shards.map((d) => (listenPort(d) || {}).port)
    .filter((p) => p !== undefined));  // else already reported
  const policies = objects.filter((o) => o.kind === "NetworkPolicy");
  const reached = new Set();
  for (const pod of pods) {
    const applying = policies.filter((p) => {
      const types = p.spec.policyTypes || ["Ingress"];
      return types.includes("Ingress") &&
        selects(p.spec.podSelector || {}, pod.labels, `NetworkPolicy ${p.metadata.name}`);
    });
    if (applying.length === 0) {
      fail(pod.where, "no NetworkPolicy restricts ingress to its pods");
      continue;
    }
    for (const policy of applying) {
      const where = `NetworkPolicy ${policy.metadata.name} (for ${pod.where})`;
      for (const rule of policy.spec.ingress || []) {
        if ((rule.from || []).some((peer) => peer.namespaceSelector)) {
          checkScraperRule(where, rule, podMetrics.has(pod) ? podMetrics.get(pod) : null);
          continue;
        }
        if (!shardPods.has(pod)) {
          fail(where, "admits connections to a pod that serves nothing");
          continue;
        }
        if (!rule.from || rule.from.length === 0) {
          fail(where, "an ingress rule without 'from' admits every source");
        }
        for (const peer of rule.from || []) {
          if (peer.ipBlock || peer.namespaceSelector || !peer.podSelector) {
            fail(where, `admits ${JSON.stringify(peer)}: only pods of the ` +
              "namespace, by the workers' and evaluators' labels");
            continue;
          }
          const matched = pods.filter((p) => selects(peer.podSelector, p.labels, where));
          const others = matched.filter((p) => !clients.has(p));
          if (others.length > 0 || matched.length === 0) {
            fail(where, `admits pods labelled ${JSON.stringify(peer.podSelector.matchLabels || {})}, ` +
              `which ${matched.length === 0 ? "match no worker or evaluator"
                : `also match ${others.map((p) => p.where).join(", ")}`}`);
          }
          matched.filter((p) => clients.has(p)).forEach((p) => reached.add(p));
        }
        if (!rule.ports || rule.ports.length === 0) {
          fail(where, "an ingress rule without ports admits every port");
        }
        for (const port of rule.ports || []) {
          if ((port.protocol || "TCP") !== "TCP" || port.endPort !== undefined ||
              (ports.size > 0 && !ports.has(port.port))) {
            fail(where, `admits port ${JSON.stringify(port)}; the shards ` +
              `listen on TCP ${[...ports].join(", ")}`);
          }
        }
      }
    }
  }
  for (const pod of clients) {
    if (!reached.has(pod)) {
      fail(pod.where, "no NetworkPolicy lets its pods reach the shards");
    }
  }
}

// The Prometheus Operator's PodMonitors: each selects pods of the render,
// and scrapes a port that every pod it selects names.
function checkPodMonitors() {
  for (const monitor of objects.filter((o) => o.kind === "PodMonitor")) {
    const where = `PodMonitor ${monitor.metadata.name}`;
    const spec = monitor.spec || {};
    const selected = pods.filter((p) => selects(spec.selector || {}, p.labels, where));
    if (selected.length === 0) {
      fail(where, "selects no pod of the render");
      continue;
    }
    const endpoints = spec.podMetricsEndpoints || [];
    if (endpoints.length === 0) fail(where, "has no podMetricsEndpoints");
    for (const endpoint of endpoints) {
      for (const pod of selected) {
        const named = pod.spec.containers.some((c) =>
          (c.ports || []).some((p) => p.name === endpoint.port));
        if (!named) {
          fail(where, `scrapes port ${JSON.stringify(endpoint.port)}, which ` +
            `${pod.where} does not name`);
        }
      }
    }
  }
}

pods.forEach(checkPod);
checkRunLabels();
checkImages();
{
  const daemons = checkDaemons();
  checkNetworkPolicies(daemons);
  checkCounts(daemons);
}
checkPodMonitors();
errors.forEach((e) => console.error(e));
process.exitCode = errors.length > 0 ? 1 : 0;
