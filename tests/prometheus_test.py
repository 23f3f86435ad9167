#!/usr/bin/env python3
"""Checks every daemon's /metrics with a real Prometheus server.

Starts Debian's `prometheus` on loopback with a scrape config generated for a
local cluster (launch_local --metrics_port: 2 shards, 2 workers, the
evaluator, in downpour mode), lets it scrape while the cluster trains, then
asks its HTTP API, at one instant during training:

  - every one of the 5 targets is up, and monsoon_build_info counts 2
    shards, 2 workers and 1 evaluator;
  - each shard's staleness histogram counts exactly its pushes
    (monsoon_shard_push_staleness_count == monsoon_shard_pushes_total);
  - each shard's examples applied per rank sum to the examples its pushes
    carried (downpour applies every push at once);
  - each histogram's +Inf bucket equals its count;
  - the workers have taken steps, and the evaluator has evaluated;

then, once both workers have finished and Prometheus has scraped their
final values (they linger, --metrics_linger_s), across daemons:

  - every shard applied exactly the examples each worker says it trained
    (monsoon_shard_samples_applied_total{rank=r} on each shard ==
    monsoon_worker_samples_total of worker r);
  - the shards' pushes sum to the workers' steps times the shards (one push
    per step to every shard), and each shard timed one apply per push;
  - each worker timed exactly one compute and one push_pull phase per step.

  tests/prometheus_test.py [--bin_dir=bazel-bin] [--prometheus=prometheus]

Under `bazel test` it finds the binaries in its runfiles. Skips (exit 0,
with a message) where prometheus is not installed (tools/setup.sh installs
it) or the Fashion-MNIST data set is absent.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def log(message):
    print(message, flush=True)


def first_ephemeral_port():
    """The kernel's first port for outgoing connections (32768 by default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
        return low if low > 11024 else 32768
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_range(count):
    """A first port p such that p .. p+count-1 are free on 127.0.0.1 now.

    Chosen at random below the kernel's ephemeral ports, so that no
    outgoing connection takes one of them before the daemons bind them.
    """
    end = first_ephemeral_port()
    for _ in range(200):
        first = random.randrange(10000, end - count)
        held = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                held.append(s)
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no %d free consecutive ports" % count)


def query(api, expr, at):
    """The vector result of an instant query at time `at`: {labels: value}."""
    url = "%s/api/v1/query?%s" % (
        api, urllib.parse.urlencode({"query": expr, "time": "%.3f" % at}))
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError("query %r failed: %s" % (expr, body))
    result = {}
    for sample in body["data"]["result"]:
        key = tuple(sorted(sample["metric"].items()))
        result[key] = float(sample["value"][1])
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin_dir")
    parser.add_argument("--prometheus", default="prometheus")
    args = parser.parse_args()
    runfiles = os.environ.get("TEST_SRCDIR")
    if runfiles:
        root = os.path.join(runfiles, os.environ.get("TEST_WORKSPACE", "__main__"))
        bin_dir = args.bin_dir or root
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        bin_dir = args.bin_dir or os.path.join(root, "bazel-bin")
    prometheus = shutil.which(args.prometheus)
    if prometheus is None:
        print("SKIPPED: prometheus is not installed (tools/setup.sh installs "
              "Debian's package)")
        return 0
    if not os.path.isdir(DATA_DIR):
        print("SKIPPED: no Fashion-MNIST data set at %s" % DATA_DIR)
        return 0

    work = tempfile.mkdtemp(prefix="prometheus_test.")
    daemons = 2 + 2 + 1
    metrics_port = free_port_range(daemons)
    web_port = free_port_range(1)
    api = "http://127.0.0.1:%d" % web_port
    # launch_local writes WORK/run/metrics_targets.json before it starts the
    # daemons; Prometheus watches that file.
    run_dir = os.path.join(work, "run")
    os.makedirs(run_dir)
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write("""global:
  scrape_interval: 500ms
  scrape_timeout: 400ms
scrape_configs:
  - job_name: monsoon
    file_sd_configs:
      - files: ['%s']
        refresh_interval: 1s
""" % os.path.join(run_dir, "metrics_targets.json"))
    server = subprocess.Popen(
        [prometheus, "--config.file=" + config,
         "--storage.tsdb.path=" + os.path.join(work, "data"),
         "--web.listen-address=127.0.0.1:%d" % web_port],
        stdout=open(os.path.join(work, "prometheus.log"), "w"),
        stderr=subprocess.STDOUT)
    cluster = None
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(api + "/-/ready", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    log("FAILED: prometheus did not start; its log:")
                    log(open(os.path.join(work, "prometheus.log")).read())
                    return 1
                time.sleep(0.2)
        cluster = subprocess.Popen(
            [os.path.join(bin_dir, "tools/launch_local"),
             "--bin_dir=" + bin_dir, "--mode=downpour", "--servers=2",
             "--workers=2", "--epochs=20", "--hidden=32",
             "--eval_interval_s=0.5", "--metrics_port=%d" % metrics_port,
             "--metrics_linger_s=8", "--work_dir=" + run_dir],
            stdout=open(os.path.join(work, "cluster.log"), "w"),
            stderr=subprocess.STDOUT)
        # Until Prometheus has scraped every daemon up, with pushes applied,
        # steps taken by both workers and an evaluation made (each target is
        # scraped on its own schedule: on a busy machine a worker's last
        # scrape can predate its first step while the shards already count
        # the other's pushes).
        deadline = time.time() + 90
        at = None
        while time.time() < deadline:
            if cluster.poll() is not None:
                break
            now = time.time()
            up = query(api, 'up{job="monsoon"} == 1', now)
            pushes = query(api, "monsoon_shard_pushes_total > 0", now)
            evals = query(api, "monsoon_evaluator_evaluations_total > 0", now)
            stepped = query(api, "monsoon_worker_steps_total > 0", now)
            if (len(up) == daemons and len(pushes) == 2 and len(stepped) == 2
                    and evals):
                at = now
                break
            time.sleep(0.5)
        if at is None:
            log("FAILED: Prometheus never saw all %d daemons up and training; "
                "the cluster's log:" % daemons)
            log(open(os.path.join(work, "cluster.log")).read()[-4000:])
            return 1

        failures = []
        checks = []

        def expect(what, ok):
            checks.append(what)
            log("%s: %s" % ("ok" if ok else "FAILED", what))
            if not ok:
                failures.append(what)

        roles = query(api, "count by (role) (monsoon_build_info)", at)
        expect("build info counts 2 shards, 2 workers, 1 evaluator: %s" % roles,
               roles == {(("role", "shard"),): 2.0,
                         (("role", "worker"),): 2.0,
                         (("role", "evaluator"),): 1.0})
        pushes = query(api, "monsoon_shard_pushes_total", at)
        counted = query(api, "monsoon_shard_push_staleness_count", at)
        expect("each shard's staleness histogram counts its pushes: %s vs %s"
               % (sorted(counted.values()), sorted(pushes.values())),
               len(pushes) == 2 and
               query(api, "monsoon_shard_push_staleness_count - "
                     "monsoon_shard_pushes_total != 0", at) == {})
        inf = query(api, 'monsoon_shard_push_staleness_bucket{le="+Inf"} - '
                    "on (instance) monsoon_shard_push_staleness_count != 0",
                    at)
        expect("each +Inf bucket equals its count", inf == {})
        applied = query(api, "sum by (instance) "
                        "(monsoon_shard_samples_applied_total)", at)
        carried = query(api, "sum by (instance) (monsoon_shard_samples_total)",
                        at)
        expect("each shard's examples applied per rank sum to the examples its "
               "pushes carried: %s vs %s" % (sorted(applied.values()),
                                             sorted(carried.values())),
               len(applied) == 2 and applied == carried)
        steps = query(api, "monsoon_worker_steps_total > 0", at)
        expect("both workers have taken steps", len(steps) == 2)
        accuracy = query(api, "monsoon_evaluator_test_accuracy", at)
        expect("the evaluator reports an accuracy in [0, 1]: %s" % accuracy,
               len(accuracy) == 1 and
               0 <= list(accuracy.values())[0] <= 1)
        during = len(checks)
        # The end of the run: both workers done and lingering; two scrape
        # intervals later Prometheus holds every daemon's final values.
        deadline = time.time() + 120
        while time.time() < deadline:
            with open(os.path.join(work, "cluster.log")) as f:
                if f.read().count("serving the final metrics") == 2:
                    break
            if cluster.poll() is not None:
                break
            time.sleep(0.2)
        else:
            log("FAILED: the workers did not finish within 120 s")
            return 1
        time.sleep(1.5)
        end = time.time()

        def by(result, label):
            """{label value: value} of a query's result."""
            out = {}
            for key, value in result.items():
                out[dict(key).get(label)] = value
            return out

        worker_samples = by(query(api, "monsoon_worker_samples_total", end),
                            "index")
        worker_steps = by(query(api, "monsoon_worker_steps_total", end),
                          "index")
        expect("both workers' final steps and examples: %s, %s"
               % (worker_steps, worker_samples),
               len(worker_samples) == 2 and len(worker_steps) == 2 and
               all(v > 0 for v in worker_steps.values()))
        for shard in ("0", "1"):
            applied = by(query(api, 'monsoon_shard_samples_applied_total'
                               '{role="shard",index="%s"}' % shard, end),
                         "rank")
            expect("shard %s applied exactly each worker's examples: %s vs "
                   "%s" % (shard, applied, worker_samples),
                   applied == worker_samples)
        pushes = sum(query(api, "monsoon_shard_pushes_total", end).values())
        expect("the shards' pushes (%d) are the workers' steps (%d) times 2 "
               "shards" % (pushes, sum(worker_steps.values())),
               pushes == 2 * sum(worker_steps.values()))
        expect("each shard timed one apply per push",
               query(api, "monsoon_shard_apply_seconds_count - on (instance) "
                     "monsoon_shard_pushes_total != 0", end) == {})
        for phase in ("compute", "push_pull"):
            counted = by(query(api, 'monsoon_worker_step_phase_seconds_count'
                               '{phase="%s"}' % phase, end), "index")
            expect("each worker timed one %s phase per step: %s vs %s"
                   % (phase, counted, worker_steps), counted == worker_steps)
        if failures:
            return 1
        log("PASSED: %d checks during training and %d at its end"
            % (during, len(checks) - during))
        return 0
    finally:
        for process in (cluster, server):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT if process is cluster
                                    else signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
