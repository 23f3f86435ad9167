#!/usr/bin/python3
"""Summary table and plots of a compare_modes run, from its results.json.

    compare_report.py --results OUT/results.json --out_dir OUT

Writes OUT/summary.md (also printed) and, with matplotlib (Debian's
python3-matplotlib), the plots:
  accuracy_vs_time.png, accuracy_vs_bytes_pushed.png,
  accuracy_vs_bytes_moved.png, loss_vs_samples.png, auc_vs_time.png and
  auc_vs_bytes_moved.png (click models, whose curves have test_auc),
  staleness_distribution.png (when a run has staleness_histogram),
  step_time_by_phase.png (when a run has step_phases), and
  samples_per_s_vs_workers.png when the runs sweep the worker count.
Results files of earlier versions, without those fields, still work: the
plots that need them are skipped with a note.
"""

import argparse
import json
import os
import sys


def time_to_target(curve, target):
    """Seconds to the first evaluation at or above `target`, or None."""
    for point in curve:
        if point["test_accuracy"] >= target:
            return point["time_s"]
    return None


def fault_summary(run):
    """What happened to a run's processes: "2 kills, 1 stop, 2 restarts",
    with elastic workers also adds and removes, or "" when nothing did."""
    counts = {}
    for event in run.get("events", []):
        what = event["what"]
        for kind in ("kill", "stop", "add", "remove"):
            if what.startswith(kind + " "):
                counts[kind] = counts.get(kind, 0) + 1
    restarts = run.get("restarts", 0)
    if restarts:
        counts["restart"] = restarts
    return ", ".join("%d %s%s" % (n, kind, "" if n == 1 else "s")
                     for kind, n in counts.items())


def summary_rows(results, target=None):
    """One row per run: the table's values, unformatted."""
    if target is None:
        target = results["target_accuracy"]
    rows = []
    for run in results["runs"]:
        rows.append({
            "run": run["name"],
            "mode": run["mode"],
            "servers": run["servers"],
            "workers": run["workers"],
            "final_test_accuracy": run["final_test_accuracy"],
            # Click models (sparse_lr) only.
            "final_test_auc": run.get("final_test_auc"),
            "time_to_target_s": time_to_target(run["curve"], target),
            "samples_per_s": run["samples_per_s"],
            "bytes_pushed": run["bytes_pushed"],
            "bytes_pulled": run["bytes_pulled"],
            "ring_bytes_sent": run.get("ring_bytes_sent", 0),
            "staleness_mean": run["staleness"]["mean"],
            "staleness_p99": run["staleness"]["p99"],
            "faults": fault_summary(run),
        })
    return rows


def _median(values):
    values = sorted(values)
    n = len(values)
    if n == 0:
        return None
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def variant_medians(results, target=None):
    """Where runs repeat a configuration over seeds (their "seed" field):
    one row per variant and counts with the medians over its seeds and
    their spread (min, max). Time to target counts only the seeds that
    reached it (`reached` of `seeds`). Empty when no run has a seed."""
    if target is None:
        target = results["target_accuracy"]
    groups = {}
    for run in results["runs"]:
        if "seed" not in run:
            continue
        key = (run.get("variant", run["mode"]), run["servers"], run["workers"])
        groups.setdefault(key, []).append(run)
    rows = []
    for (variant, servers, workers), runs in groups.items():
        times = [t for t in (time_to_target(r["curve"], target) for r in runs)
                 if t is not None]
        accuracies = [r["final_test_accuracy"] for r in runs]
        aucs = [r["final_test_auc"] for r in runs if "final_test_auc" in r]
        rates = [r["samples_per_s"] for r in runs]
        rows.append({
            "variant": variant, "servers": servers, "workers": workers,
            "seeds": len(runs), "reached": len(times),
            "time_to_target_s": _median(times),
            "time_spread": (min(times), max(times)) if times else None,
            "final_test_accuracy": _median(accuracies),
            "accuracy_spread": (min(accuracies), max(accuracies)),
            "final_test_auc": _median(aucs),
            "auc_spread": (min(aucs), max(aucs)) if aucs else None,
            "samples_per_s": _median(rates),
        })
    return rows


def format_medians(rows, target):
    """The medians as a Markdown table; an AUC column when a run has one."""
    auc = any(r.get("final_test_auc") is not None for r in rows)
    lines = ["| configuration | seeds reaching %.2f | time to %.2f (min-max) | "
             "final test accuracy (min-max) |%s samples/s |" % (
                 target, target, " final test AUC (min-max) |" if auc else ""),
             "|---|---|---|---|%s---|" % ("---|" if auc else "")]
    for r in rows:
        reached = ("%.1f s (%.1f-%.1f)" % ((r["time_to_target_s"],) +
                                           r["time_spread"])
                   if r["time_to_target_s"] is not None else "not reached")
        auc_cell = ""
        if auc:
            auc_cell = (" %.4f (%.4f-%.4f) |" % ((r["final_test_auc"],) +
                                                  r["auc_spread"])
                        if r.get("final_test_auc") is not None else " - |")
        lines.append("| %s (%d servers, %d workers) | %d of %d | %s | "
                     "%.4f (%.4f-%.4f) |%s %.0f |" % (
                         r["variant"], r["servers"], r["workers"],
                         r["reached"], r["seeds"], reached,
                         r["final_test_accuracy"], r["accuracy_spread"][0],
                         r["accuracy_spread"][1], auc_cell, r["samples_per_s"]))
    return "\n".join(lines) + "\n"


def staleness_fractions(run):
    """The run's pushes per staleness as fractions of all its pushes
    (index = staleness; the last entry counts every push at least that
    stale), or None when the run has no staleness_histogram or it counts no
    push."""
    counts = run.get("staleness_histogram") or []
    total = sum(counts)
    if total <= 0:
        return None
    return [c / total for c in counts]


# Phases in a step's order; others (from a newer worker) follow by name.
PHASE_ORDER = ["compute", "pull", "push", "push_pull"]


def step_phase_ms(run):
    """Where a step of the run's workers went: [(phase, mean ms per step)],
    in PHASE_ORDER. A step is counted once per "compute" (every mode computes
    once a step; without it, the most frequent phase), so that a phase run
    every few steps (downpour's pull every n_fetch) weighs what it costs a
    step on average, and the bars of a run add up to its mean step time.
    [] when the run has no step_phases."""
    phases = run.get("step_phases") or {}
    if not phases:
        return []
    steps = phases.get("compute", {}).get("count") or max(
        p.get("count", 0) for p in phases.values())
    if steps <= 0:
        return []
    names = sorted(phases, key=lambda name: (
        PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER),
        name))
    return [(name, 1000.0 * phases[name]["seconds"] / steps) for name in names]


def _mb(value):
    return "%.1f" % (value / 1e6)


def format_table(rows, target):
    """The rows as a Markdown table; a faults column when any run had one,
    a final test AUC column when any run has one (click models)."""
    faults = any(r["faults"] for r in rows)
    auc = any(r.get("final_test_auc") is not None for r in rows)
    header = ("| run | final test accuracy |%s time to %.2f | samples/s | "
              "pushed MB | pulled MB | total MB | staleness mean | "
              "staleness p99 |" % (" final test AUC |" if auc else "", target))
    if faults:
        header += " faults |"
    lines = [header, "|" + "---|" * (9 + bool(faults) + auc)]
    for r in rows:
        reached = r["time_to_target_s"]
        auc_cell = ""
        if auc:
            auc_cell = (" %.4f |" % r["final_test_auc"]
                        if r.get("final_test_auc") is not None else " - |")
        line = "| %s | %.4f |%s %s | %.0f | %s | %s | %s | %.2f | %d |" % (
            r["run"], r["final_test_accuracy"], auc_cell,
            "%.1f s" % reached if reached is not None else "not reached",
            r["samples_per_s"], _mb(r["bytes_pushed"]), _mb(r["bytes_pulled"]),
            _mb(r["bytes_pushed"] + r["bytes_pulled"] + r["ring_bytes_sent"]),
            r["staleness_mean"], r["staleness_p99"])
        if faults:
            line += " %s |" % (r["faults"] or "none")
        lines.append(line)
    return "\n".join(lines) + "\n"


_RATE_UNITS = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1}


def link_rate(link):
    """Bits per second of a --link value ("100mbit,2ms"); None for
    "loopback" or a value without a rate."""
    rate = link.split(",")[0].strip().lower()
    for unit, scale in _RATE_UNITS.items():
        if rate.endswith(unit):
            try:
                return float(rate[:-len(unit)]) * scale
            except ValueError:
                return None
    return None


def roofline_rows(results):
    """For each run on a shaped link: the time a worker's step takes, and
    the least time the links' bandwidth allows for the bytes the run moved
    per step. A worker's link carries its pushes, and the ring's segments,
    up, and its pulls, and the ring's segments, down, at once (full
    duplex); a shard's link carries every worker's share of a round of
    steps (W steps' pushes and pulls over S shards). Every worker trains
    as many steps, so the run's steps take at least the slowest worker's
    link time (--link_worker), in every mode (without a barrier the faster
    workers finish first), and at least a shard's. Delay is left out. Empty
    on loopback."""
    rate = link_rate(results.get("link", "loopback"))
    if rate is None:
        return []
    given = results.get("scenario", {}).get(
        "worker_rates", results.get("worker_rates", {}))
    worker_rates = {int(k): float(v) for k, v in given.items()}
    rows = []
    for run in results["runs"]:
        workers, servers = run["workers"], run["servers"]
        batch = run.get("config", {}).get("batch_size", 0)
        samples, seconds = run.get("samples", 0), run.get("train_time_s", 0)
        if not (workers and batch and samples and seconds):
            continue
        steps = samples / (workers * batch)  # per worker
        up = run["bytes_pushed"] / (workers * steps)
        down = run["bytes_pulled"] / (workers * steps)
        ring = run.get("ring_bytes_sent", 0) / (workers * steps)
        slowest = min(worker_rates.get(w, rate) for w in range(workers))
        bound = max(up + ring, down + ring) * 8 / slowest
        if servers and (up or down):
            bound = max(bound, workers * max(up, down) / servers * 8 / rate)
        measured = seconds / steps
        rows.append({"run": run["name"], "measured_ms": measured * 1e3,
                     "bound_ms": bound * 1e3,
                     "ratio": measured / bound if bound else None})
    return rows


def format_roofline(rows):
    lines = ["| run | step (ms) | link's bound (ms) | step / bound |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %.2f | %.2f | %s |" % (
            r["run"], r["measured_ms"], r["bound_ms"],
            "%.2fx" % r["ratio"] if r["ratio"] else "-"))
    return "\n".join(lines) + "\n"


def format_failed(failed):
    """The runs that failed (results.json entries with "failed"), each with
    its error; "" when none did."""
    if not failed:
        return ""
    lines = ["", "## Runs that failed", ""]
    for r in failed:
        lines.append("- %s: %s" % (r["name"], r["failed"]))
    return "\n".join(lines) + "\n"


def format_summary(results, target=None):
    if target is None:
        target = results["target_accuracy"]
    link = results["link"]
    if link != "loopback" and not results.get("delay_emulated", True):
        link += " (rate shaped; this kernel has no netem, so no delay)"
    elif results.get("delay_method") == "proxy":
        link += " (rate shaped with tbf, delay added by user-space proxies)"
    chaos = ""
    if results.get("chaos"):
        chaos = " Faults injected into every run: %s." % results["chaos"]
    summary = ("# Monsoon mode comparison\n\nNetwork: %s. Time to target: "
               "first evaluation at or above %.2f test accuracy.%s\n\n%s" %
               (link, target, chaos,
                format_table(summary_rows(results, target), target)))
    roofline = roofline_rows(results)
    if roofline:
        summary += ("\n## Against the link's bound\n\nA worker's step, "
                    "measured (training time over its steps) and the least "
                    "the link's bandwidth allows for the bytes the run moved "
                    "per step: a ring sends 2(N-1)/N of the gradient each "
                    "way per worker; a parameter server's worker pushes and "
                    "pulls through its link, and each shard's link carries "
                    "every worker's share. Delay left out; 1.00x is at the "
                    "bound.\n\n" + format_roofline(roofline))
    medians = variant_medians(results, target)
    if medians:
        summary += ("\n## Medians over seeds\n\n" +
                    format_medians(medians, target))
    return summary


def _label(run, many_sizes, same_modes=False):
    """A run's legend entry: its mode, with the counts in a sweep; its name
    where several runs share a mode (other configs of it)."""
    if same_modes and run.get("name"):
        return run["name"]
    if many_sizes:
        return "%s (%d servers, %d workers)" % (run["mode"], run["servers"],
                                                 run["workers"])
    return run["mode"]


def write_plots(results, out_dir):
    """Writes the PNG files; returns their paths (none without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare_report: matplotlib is missing (apt-get install "
              "python3-matplotlib); no plots written", file=sys.stderr)
        return []
    runs = results["runs"]
    # allreduce: the ring's bytes at each point of the curve. Every step
    # sends the same bytes, so they go with the examples trained.
    for run in runs:
        ring, samples = run.get("ring_bytes_sent", 0), run.get("samples", 0)
        for p in run["curve"]:
            p["ring_bytes"] = ring * p["samples"] / samples if samples else 0
    many_sizes = len({(r["servers"], r["workers"]) for r in runs}) > 1
    same_modes = len({r["mode"] for r in runs}) < len(runs) and not many_sizes
    title_suffix = ""
    if results["link"] != "loopback":
        title_suffix = " - link " + results["link"]
        if not results.get("delay_emulated", True):
            title_suffix += " (rate only, no delay)"
        elif results.get("delay_method") == "proxy":
            title_suffix += " (delay by proxy)"
    paths = []

    def line_plot(name, x_of, y_key, xlabel, ylabel, title, events=False):
        fig, ax = plt.subplots(figsize=(8, 5))
        for run in runs:
            xs = [x_of(p) for p in run["curve"]]
            ys = [p[y_key] for p in run["curve"]]
            line, = ax.plot(xs, ys, marker=".", label=_label(run, many_sizes, same_modes))
            if not events:
                continue
            # The run's faults and restarts, in its colour: a dashed line
            # for a fault, a dotted one for a restart, a dash-dot one for a
            # worker joining or leaving (elastic runs); events within 0.1 s
            # share a line and a label.
            marks = {}
            for event in run.get("events", []):
                what = event["what"]
                if what.startswith(("kill ", "stop ")):
                    style = "--"
                elif what.startswith(("add ", "remove ")):
                    style = "-."
                elif what.startswith("restarted "):
                    style = ":"
                else:
                    continue
                key = (style, round(event["time_s"], 1))
                marks.setdefault(key, []).append(what.split(" (")[0])
            for (style, time_s), labels in marks.items():
                ax.axvline(time_s, color=line.get_color(), linestyle=style,
                           alpha=0.6)
                ax.annotate(", ".join(labels), (time_s, 0),
                            xycoords=("data", "axes fraction"), rotation=90,
                            fontsize=7, color=line.get_color(),
                            xytext=(2, 4), textcoords="offset points")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title + title_suffix)
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    line_plot("accuracy_vs_time.png", lambda p: p["time_s"], "test_accuracy",
              "wall time (s)", "test accuracy", "Test accuracy against time",
              events=True)
    line_plot("accuracy_vs_bytes_pushed.png", lambda p: p["bytes_pushed"] / 1e6,
              "test_accuracy", "bytes pushed by the workers (MB)",
              "test accuracy", "Test accuracy against bytes pushed")
    line_plot("accuracy_vs_bytes_moved.png",
              lambda p: (p["bytes_pushed"] + p.get("bytes_pulled", 0)
                         + p["ring_bytes"]) / 1e6,
              "test_accuracy",
              "bytes pushed and pulled by the workers, and sent in the ring "
              "(MB)",
              "test accuracy", "Test accuracy against bytes moved both ways")
    if all("test_auc" in p for run in runs for p in run["curve"]) and any(
            run["curve"] for run in runs):
        # Click models: AUC, the measure their users compare.
        line_plot("auc_vs_time.png", lambda p: p["time_s"], "test_auc",
                  "wall time (s)", "test AUC", "Test AUC against time",
                  events=True)
        line_plot("auc_vs_bytes_moved.png",
                  lambda p: (p["bytes_pushed"] + p.get("bytes_pulled", 0)
                         + p["ring_bytes"]) / 1e6,
                  "test_auc",
                  "bytes pushed and pulled by the workers, and sent in the "
                  "ring (MB)",
                  "test AUC", "Test AUC against bytes moved both ways")
    line_plot("loss_vs_samples.png", lambda p: p["samples"], "test_loss",
              "training samples seen", "test loss (cross-entropy)",
              "Test loss against samples seen")

    def skipped(name, why):
        print("compare_report: %s not written: %s" % (name, why),
              file=sys.stderr)

    def save(fig, name):
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    # Staleness: a line per run over the staleness values, fractions of its
    # pushes (runs of different lengths and push counts compare so).
    with_staleness = [(r, staleness_fractions(r)) for r in runs]
    with_staleness = [(r, f) for r, f in with_staleness if f is not None]
    if with_staleness:
        fig, ax = plt.subplots(figsize=(8, 5))
        for run, fractions in with_staleness:
            ax.plot(range(len(fractions)), fractions, marker="o",
                    label=_label(run, many_sizes, same_modes))
        longest = max(len(f) for _, f in with_staleness)
        ax.set_xticks(range(longest) if longest <= 20 else
                      range(0, longest, max(1, longest // 10)))
        ax.set_xlabel("staleness (versions between pull and apply; a shard's "
                      "last bucket holds every push at least that stale)",
                      fontsize=8)
        ax.set_ylabel("fraction of pushes")
        ax.set_title("Staleness distribution" + title_suffix)
        ax.grid(True, alpha=0.3)
        ax.legend()
        save(fig, "staleness_distribution.png")
    else:
        skipped("staleness_distribution.png",
                "no run has a staleness_histogram with pushes")

    # Step time: a stacked horizontal bar per run, mean ms per step by phase.
    with_phases = [(r, step_phase_ms(r)) for r in runs]
    with_phases = [(r, p) for r, p in with_phases if p]
    if with_phases:
        fig, ax = plt.subplots(
            figsize=(8, 2.0 + 0.5 * len(with_phases)))
        labels = [_label(r, many_sizes, same_modes) for r, _ in with_phases]
        names = []
        for _, phases in with_phases:
            names += [n for n, _ in phases if n not in names]
        names.sort(key=lambda n: (PHASE_ORDER.index(n) if n in PHASE_ORDER
                                  else len(PHASE_ORDER), n))
        left = [0.0] * len(with_phases)
        for name in names:
            widths = [dict(p).get(name, 0.0) for _, p in with_phases]
            ax.barh(range(len(with_phases)), widths, left=left, label=name)
            left = [l + w for l, w in zip(left, widths)]
        ax.set_yticks(range(len(with_phases)))
        ax.set_yticklabels(labels)
        ax.invert_yaxis()  # the first run on top
        ax.set_xlabel("mean time per step (ms), over every worker's steps")
        ax.set_title("Where a step's time goes" + title_suffix)
        ax.grid(True, axis="x", alpha=0.3)
        # Below the axes, so that it never hides a bar's end.
        ax.margins(x=0.05)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25),
                  ncol=len(names), frameon=False)
        save(fig, "step_time_by_phase.png")
    else:
        skipped("step_time_by_phase.png", "no run has step_phases")

    if len({r["workers"] for r in runs}) > 1:
        fig, ax = plt.subplots(figsize=(8, 5))
        for mode in dict.fromkeys(r["mode"] for r in runs):
            for servers in sorted({r["servers"] for r in runs}):
                points = sorted((r["workers"], r["samples_per_s"]) for r in runs
                                if r["mode"] == mode and r["servers"] == servers)
                label = mode if len({r["servers"] for r in runs}) == 1 else (
                    "%s (%d servers)" % (mode, servers))
                ax.plot([p[0] for p in points], [p[1] for p in points],
                        marker="o", label=label)
        ax.set_xlabel("workers")
        ax.set_ylabel("training samples per second")
        ax.set_title("Throughput against worker count" + title_suffix)
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = os.path.join(out_dir, "samples_per_s_vs_workers.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", required=True, help="results.json")
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--target", type=float, default=None,
                        help="override the target accuracy in results.json")
    args = parser.parse_args(argv)
    try:
        with open(args.results) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        print("compare_report: cannot read %s: %s" % (args.results, e),
              file=sys.stderr)
        return 1
    failed = [r for r in results.get("runs", []) if "failed" in r]
    results["runs"] = [r for r in results.get("runs", []) if "failed" not in r]
    summary = format_summary(results, args.target) + format_failed(failed)
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write(summary)
    print()
    print(summary)
    for path in write_plots(results, args.out_dir):
        print("plot:", path)
    print("summary:", os.path.join(args.out_dir, "summary.md"))
    print("results:", args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
