#!/usr/bin/env bash
# A short real comparison of two modes (small model, one epoch, one shard):
# the run must leave results.json with both runs, summary.md and the plots.
set -euo pipefail
out="${TEST_TMPDIR:-$(mktemp -d)}/cmp"
compare="$1"
report="$2"
"$compare" --modes=sync,hogwild --servers=1 --workers=2 --epochs=1 \
  --hidden=32 --eval_interval_s=1 --report_script="$report" \
  --out_dir="$out" > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }

/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
results = json.load(open(os.path.join(out, "results.json")))
names = [r["name"] for r in results["runs"]]
assert names == ["sync-s1-w2", "hogwild-s1-w2"], names
for r in results["runs"]:
    assert r["curve"], r["name"]
    assert 0.5 < r["final_test_accuracy"] <= 1, r["final_test_accuracy"]
    assert r["samples"] == 2 * (30000 // 64) * 64, r["samples"]
summary = open(os.path.join(out, "summary.md")).read()
assert "| sync-s1-w2 |" in summary and "| hogwild-s1-w2 |" in summary
for png in ["accuracy_vs_time.png", "accuracy_vs_bytes_pushed.png",
            "loss_vs_samples.png"]:
    with open(os.path.join(out, png), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", png
print("compare_modes_test: results.json, summary.md and 3 plots OK")
PY
grep -q "sync-s1-w2" "$out.log"  # the table was printed

# With faults: server 1 and worker 0 killed (SIGKILL) as training starts. The
# launcher restarts both; the run completes and the table counts them.
chaos="${out}-chaos"
"$compare" --modes=downpour --servers=2 --workers=2 --epochs=1 --hidden=32 \
  --eval_interval_s=1 --report_script="$report" --out_dir="$chaos" \
  --chaos=kill:server1@0.3s,kill:worker0@0.3s \
  > "$chaos.log" 2>&1 || { cat "$chaos.log"; exit 1; }
/usr/bin/python3 - "$chaos" <<'PY'
import json, os, sys
out = sys.argv[1]
results = json.load(open(os.path.join(out, "results.json")))
assert results["chaos"] == "kill:server1@0.3s,kill:worker0@0.3s", results
[run] = results["runs"]
whats = [e["what"] for e in run["events"]]
for expected in ["kill server 1 (SIGKILL)", "kill worker 0 (SIGKILL)",
                 "restarted server 1", "restarted worker 0"]:
    assert expected in whats, (expected, whats)
assert run["restarts"] == 2, run["restarts"]
assert 0.5 < run["final_test_accuracy"] <= 1, run["final_test_accuracy"]
summary = open(os.path.join(out, "summary.md")).read()
assert "| 2 kills, 2 restarts |" in summary, summary
print("compare_modes_test: a run with two processes killed completed OK")
PY
