#!/usr/bin/env python3
"""Failover benchmark: what a killed shard costs, with and without replicas.

Runs launch_local once per (mode, --replicas, run) on loopback, SIGKILLing a
random server at a random moment of training (or none, with --no_kill), and
prints, per mode and replica count, from each run's metrics.json:

  runs                 runs that ended (a failed run is listed apart)
  lost-free            runs in which no acknowledged update was lost
  acknowledged, lost   updates the shards acknowledged as applied, and of
                       them those no surviving copy had when the worker came
                       back (summed over the runs; the workers' ledgers)
  gap p50 / max        the longest time between two steps of any worker,
                       median and maximum over the runs
  samples/s p50        the median of the runs' training throughput

Usage (after bazel build //...):
  tools/failover_bench.py --modes=downpour,hogwild,onebit --runs=20
  tools/failover_bench.py --modes=downpour --runs=5 --no_kill   # throughput
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="downpour,hogwild,onebit",
                        help="comma-separated modes")
    parser.add_argument("--replicas", default="0,1",
                        help="comma-separated --replicas values to compare")
    parser.add_argument("--runs", type=int, default=5,
                        help="runs per mode and replica count")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--kill_from_s", type=float, default=0.5,
                        help="earliest kill, seconds from the start of "
                             "training, the first push a shard applied "
                             "(launch_local --chaos)")
    parser.add_argument("--kill_to_s", type=float, default=2.5,
                        help="latest kill (a 1-epoch run of the MLP trains "
                             "for about 3 s here)")
    parser.add_argument("--no_kill", action="store_true",
                        help="kill nothing: measure the cost of replicas")
    parser.add_argument("--seed", type=int, default=1,
                        help="seeds the choice of server and moment")
    parser.add_argument("--bin_dir", default="bazel-bin",
                        help="where tools/launch_local is")
    parser.add_argument("--config", default="",
                        help="a base training config (text-format "
                        "TrainingConfig) for every run, as launch_local "
                        "--config: say, max_staleness or pull_compression")
    return parser.parse_args()


def run_once(args, mode, replicas, chaos, work_dir):
    metrics = os.path.join(work_dir, "metrics.json")
    command = [
        os.path.join(args.bin_dir, "tools", "launch_local"),
        f"--mode={mode}", f"--servers={args.servers}",
        f"--workers={args.workers}", f"--epochs={args.epochs}",
        f"--replicas={replicas}", f"--work_dir={work_dir}",
        f"--metrics_out={metrics}",
    ]
    if chaos:
        command.append(f"--chaos={chaos}")
    if args.config:
        command.append(f"--config={args.config}")
    with open(os.path.join(work_dir, "log"), "w") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
    if code != 0 or not os.path.exists(metrics):
        return None
    with open(metrics) as f:
        return json.load(f)


def main():
    args = parse_args()
    chooser = random.Random(args.seed)
    rows = []
    for mode in args.modes.split(","):
        for replicas in [int(r) for r in args.replicas.split(",")]:
            results, failed = [], []
            for run in range(args.runs):
                chaos = ""
                if not args.no_kill:
                    server = chooser.randrange(args.servers)
                    at = chooser.uniform(args.kill_from_s, args.kill_to_s)
                    chaos = f"kill:server{server}@{at:.2f}s"
                work_dir = tempfile.mkdtemp(prefix="failover-")
                metrics = run_once(args, mode, replicas, chaos, work_dir)
                if metrics is None:
                    failed.append(f"{chaos or 'no fault'} (see {work_dir}/log)")
                    continue
                results.append(metrics)
                print(f"{mode} replicas={replicas} run {run + 1}: {chaos or '-'}"
                      f" acknowledged {metrics['updates_acknowledged']}"
                      f" lost {metrics['updates_lost']}"
                      f" gap {metrics['max_step_gap_s']:.3f} s"
                      f" {metrics['samples_per_s']:.0f} samples/s",
                      flush=True)
            rows.append((mode, replicas, results, failed))
    print()
    print("| mode | replicas | runs | lost-free | acknowledged | lost "
          "| gap p50 (s) | gap max (s) | samples/s p50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, replicas, results, failed in rows:
        if not results:
            print(f"| {mode} | {replicas} | 0 | - | - | - | - | - | - |")
            continue
        gaps = [r["max_step_gap_s"] for r in results]
        print(f"| {mode} | {replicas} | {len(results)} "
              f"| {sum(1 for r in results if r['updates_lost'] == 0)} "
              f"| {sum(r['updates_acknowledged'] for r in results)} "
              f"| {sum(r['updates_lost'] for r in results)} "
              f"| {statistics.median(gaps):.3f} | {max(gaps):.3f} "
              f"| {statistics.median(r['samples_per_s'] for r in results):.0f}"
              f" |")
    for mode, replicas, _, failed in rows:
        for what in failed:
            print(f"failed: {mode} replicas={replicas}: {what}")
    return 1 if any(failed for _, _, _, failed in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
