#!/usr/bin/python3
"""Summary table and plots of a compare_modes run, from its results.json.

    compare_report.py --results OUT/results.json --out_dir OUT

Writes OUT/summary.md (also printed) and, with matplotlib (Debian's
python3-matplotlib), the plots:
  accuracy_vs_time.png, accuracy_vs_bytes_pushed.png, loss_vs_samples.png,
  and samples_per_s_vs_workers.png when the runs sweep the worker count.
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
    or "" when nothing did."""
    counts = {}
    for event in run.get("events", []):
        what = event["what"]
        for kind in ("kill", "stop"):
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
            "time_to_target_s": time_to_target(run["curve"], target),
            "samples_per_s": run["samples_per_s"],
            "bytes_pushed": run["bytes_pushed"],
            "bytes_pulled": run["bytes_pulled"],
            "staleness_mean": run["staleness"]["mean"],
            "staleness_p99": run["staleness"]["p99"],
            "faults": fault_summary(run),
        })
    return rows


def _mb(value):
    return "%.1f" % (value / 1e6)


def format_table(rows, target):
    """The rows as a Markdown table; a faults column when any run had one."""
    faults = any(r["faults"] for r in rows)
    header = ("| run | final test accuracy | time to %.2f | samples/s | "
              "pushed MB | pulled MB | staleness mean | staleness p99 |" %
              target)
    if faults:
        header += " faults |"
    lines = [header, "|" + "---|" * (9 if faults else 8)]
    for r in rows:
        reached = r["time_to_target_s"]
        line = "| %s | %.4f | %s | %.0f | %s | %s | %.2f | %d |" % (
            r["run"], r["final_test_accuracy"],
            "%.1f s" % reached if reached is not None else "not reached",
            r["samples_per_s"], _mb(r["bytes_pushed"]), _mb(r["bytes_pulled"]),
            r["staleness_mean"], r["staleness_p99"])
        if faults:
            line += " %s |" % (r["faults"] or "none")
        lines.append(line)
    return "\n".join(lines) + "\n"


def format_summary(results, target=None):
    if target is None:
        target = results["target_accuracy"]
    link = results["link"]
    if link != "loopback" and not results.get("delay_emulated", True):
        link += " (rate shaped; this kernel has no netem, so no delay)"
    chaos = ""
    if results.get("chaos"):
        chaos = " Faults injected into every run: %s." % results["chaos"]
    return ("# Monsoon mode comparison\n\nNetwork: %s. Time to target: first "
            "evaluation at or above %.2f test accuracy.%s\n\n%s" %
            (link, target, chaos,
             format_table(summary_rows(results, target), target)))


def _label(run, many_sizes):
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
    many_sizes = len({(r["servers"], r["workers"]) for r in runs}) > 1
    title_suffix = ""
    if results["link"] != "loopback":
        title_suffix = " - link " + results["link"]
        if not results.get("delay_emulated", True):
            title_suffix += " (rate only, no delay)"
    paths = []

    def line_plot(name, x_of, y_key, xlabel, ylabel, title, events=False):
        fig, ax = plt.subplots(figsize=(8, 5))
        for run in runs:
            xs = [x_of(p) for p in run["curve"]]
            ys = [p[y_key] for p in run["curve"]]
            line, = ax.plot(xs, ys, marker=".", label=_label(run, many_sizes))
            if not events:
                continue
            # The run's faults and restarts, in its colour: a dashed line
            # for a fault, a dotted one for a restart; events within 0.1 s
            # share a line and a label.
            marks = {}
            for event in run.get("events", []):
                what = event["what"]
                if what.startswith(("kill ", "stop ")):
                    style = "--"
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
    line_plot("loss_vs_samples.png", lambda p: p["samples"], "test_loss",
              "training samples seen", "test loss (cross-entropy)",
              "Test loss against samples seen")

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
    summary = format_summary(results, args.target)
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
