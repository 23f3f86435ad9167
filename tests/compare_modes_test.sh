#!/usr/bin/env bash
# A short real comparison of two modes (small model, one epoch, one shard):
# the run must leave results.json with both runs, summary.md and the plots,
# and its events must say that a fault due after the run ended never came.
set -euo pipefail
out="${TEST_TMPDIR:-$(mktemp -d)}/cmp"
compare="$1"
report="$2"
"$compare" --modes=sync,hogwild --servers=1 --workers=2 --epochs=1 \
  --hidden=32 --eval_interval_s=1 --report_script="$report" \
  --chaos=kill:server0@1000s \
  --out_dir="$out" > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }

/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
results = json.load(open(os.path.join(out, "results.json")))
names = [r["name"] for r in results["runs"]]
assert names == ["sync-s1-w2", "hogwild-s1-w2"], names
for r in results["runs"]:
    assert r["curve"], r["name"]
    # The fault due long after the run ended is said not to have happened.
    whats = [e["what"] for e in r["events"]]
    assert len(whats) == 1 and whats[0].startswith(
        "kill:server0@1000s: not injected: training ended "), whats
    assert 0.5 < r["final_test_accuracy"] <= 1, r["final_test_accuracy"]
    assert r["samples"] == 2 * (30000 // 64) * 64, r["samples"]
    # One shard: its staleness histogram counts every push once.
    assert sum(r["staleness_histogram"]) == r["pushes"] > 0, r
    # Summed over the workers' reports (empty while workers report none).
    for phase, t in r["step_phases"].items():
        assert t["count"] > 0 and t["seconds"] >= 0, (phase, t)
        assert abs(t["mean_ms"] - 1000 * t["seconds"] / t["count"]) <= (
            1e-5 * t["mean_ms"] + 1e-9), (phase, t)
    # The run's own metrics.json holds the same fields.
    own = json.load(open(os.path.join(out, "runs", r["name"], "metrics.json")))
    assert own["staleness_histogram"] == r["staleness_histogram"], own
    assert own["step_phases"] == r["step_phases"], own
# sync applies every push to the version it was computed from.
sync = results["runs"][0]
assert sync["staleness_histogram"] == [sync["pushes"]], sync
summary = open(os.path.join(out, "summary.md")).read()
assert "| sync-s1-w2 |" in summary and "| hogwild-s1-w2 |" in summary
pngs = ["accuracy_vs_time.png", "accuracy_vs_bytes_pushed.png",
        "loss_vs_samples.png", "staleness_distribution.png"]
if any(r["step_phases"] for r in results["runs"]):
    pngs.append("step_time_by_phase.png")
for png in pngs:
    with open(os.path.join(out, png), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", png
print("compare_modes_test: results.json, summary.md and %d plots OK" %
      len(pngs))
PY
grep -q "sync-s1-w2" "$out.log"  # the table was printed

# The same sync run over Unix domain sockets (--unix_sockets): the servers
# listen on unix:PATH, every process reaches them there, and the run ends
# with the same weights, bit for bit (sync with a seed is reproducible).
uds="${out}-unix"
"$compare" --modes=sync --servers=1 --workers=2 --epochs=1 \
  --hidden=32 --eval_interval_s=1 --report_script="$report" --unix_sockets \
  --out_dir="$uds" > "$uds.log" 2>&1 || { cat "$uds.log"; exit 1; }
grep -q "launch: 1 servers up at unix:/" "$uds.log" || { cat "$uds.log"; exit 1; }
/usr/bin/python3 - "$out" "$uds" <<'PY'
import json, os, sys
tcp, uds = (json.load(open(os.path.join(d, "results.json")))["runs"][0]
            for d in sys.argv[1:])
assert tcp["name"] == uds["name"] == "sync-s1-w2", (tcp["name"], uds["name"])
assert uds["final_test_accuracy"] == tcp["final_test_accuracy"], (
    uds["final_test_accuracy"], tcp["final_test_accuracy"])
for key in ["samples", "test_accuracy", "test_loss"]:
    assert uds["curve"][-1][key] == tcp["curve"][-1][key], (
        key, uds["curve"][-1], tcp["curve"][-1])
print("compare_modes_test: sync over Unix domain sockets ended as over TCP, "
      "bit for bit")
PY
# The progress line, from the daemons' figures: each run ends on its last
# epoch with a test accuracy.
grep -Eq "^hogwild-s1-w2 +epoch 1/1 +[0-9]+ samples/s +test accuracy 0\.[0-9]{4}" \
  "$out.log" || { cat "$out.log"; exit 1; }

# With faults: server 1 and worker 0 killed (SIGKILL) 0.3 s after the first
# push a shard applied (--chaos counts from there), 4 epochs so that the
# kills land during training even where an epoch takes a few tenths of a
# second (in allreduce the clock starts with the workers). The launcher
# restarts both; the downpour run completes and the table counts
# them. allreduce cannot take a killed worker back: its run fails, is
# recorded with its error, and the comparison still writes everything else
# (and exits 1, naming the failed run).
chaos="${out}-chaos"
status=0
"$compare" --modes=downpour,allreduce --servers=2 --workers=2 --epochs=4 \
  --hidden=32 --eval_interval_s=1 --report_script="$report" \
  --out_dir="$chaos" --chaos=kill:server1@0.3s,kill:worker0@0.3s \
  > "$chaos.log" 2>&1 || status=$?
[ "$status" -eq 1 ] || { cat "$chaos.log"; echo "exit $status, not 1"; exit 1; }
grep -q "1 of 2 runs failed (allreduce-s2-w2)" "$chaos.log" || {
  cat "$chaos.log"; exit 1; }
/usr/bin/python3 - "$chaos" "$chaos.log" <<'PY'
import json, os, re, sys
out = sys.argv[1]
results = json.load(open(os.path.join(out, "results.json")))
assert results["chaos"] == "kill:server1@0.3s,kill:worker0@0.3s", results
# The downpour run (the first): the kills come 0.3 s or more after a shard
# applied its first push, and not before it.
times = {}
for line in open(sys.argv[2]):
    m = re.search(r"launch: ([0-9.]+) s: (training began|kill server 1)", line)
    if m and m.group(2) not in times:
        times[m.group(2)] = float(m.group(1))
assert set(times) == {"training began", "kill server 1"}, times
assert times["kill server 1"] - times["training began"] >= 0.25, times
run, failed = results["runs"]
assert failed["name"] == "allreduce-s2-w2" and failed["mode"] == "allreduce"
assert "not restarted: in mode allreduce" in failed["failed"], failed
whats = [e["what"] for e in run["events"]]
for expected in ["kill server 1 (SIGKILL)", "kill worker 0 (SIGKILL)",
                 "restarted server 1", "restarted worker 0"]:
    assert expected in whats, (expected, whats)
assert run["restarts"] == 2, run["restarts"]
assert 0.5 < run["final_test_accuracy"] <= 1, run["final_test_accuracy"]
summary = open(os.path.join(out, "summary.md")).read()
assert "| 2 kills, 2 restarts |" in summary, summary
assert "## Runs that failed\n\n- allreduce-s2-w2: " in summary, summary
print("compare_modes_test: a run with two processes killed completed OK")
PY

# With replicas (--replicas=1): server 1 killed during training. Its range
# goes on at its backup in server 0; restarted, it copies its ranges back
# and is their backup; no update a shard acknowledged is lost (the workers'
# ledgers against the shards'). Sync forwards each step once it closes.
# (Training takes about a second here: the kill at 0.25 s leaves room for
# a machine twice as fast, or a launcher late to kill.)
replicated="${out}-replicas"
"$compare" --modes=downpour,onebit,sync --servers=2 --workers=2 --epochs=2 \
  --hidden=32 --eval_interval_s=1 --report_script="$report" \
  --out_dir="$replicated" --replicas=1 --chaos=kill:server1@0.25s \
  > "$replicated.log" 2>&1 || { cat "$replicated.log"; exit 1; }
/usr/bin/python3 - "$replicated" <<'PY'
import json, os, sys
out = sys.argv[1]
results = json.load(open(os.path.join(out, "results.json")))
assert len(results["runs"]) == 3, results["runs"]
for run in results["runs"]:
    assert run["replicas"] == 1, run["name"]
    assert run["failovers"] == 1, (run["name"], run["failovers"])
    assert run["restarts"] == 1, (run["name"], run["restarts"])
    assert run["updates_lost"] == 0 and run["examples_lost"] == 0, run["name"]
    # Every step pushed to both shards, each applied once. A worker's push
    # in flight when the process died is sent again, to both shards, and
    # answered there as a duplicate where it was applied: its first answer
    # was lost with the process, or ended by the worker when the other
    # shard failed, or came (and was counted) before the other failed. So
    # at most one duplicate per worker and shard, and every push answered.
    steps = 2 * 2 * (30000 // 64)  # 2 workers, 2 epochs
    acked = run["updates_acknowledged"]
    duplicates = run["updates_answered_as_duplicate"]
    assert 0 <= duplicates <= 2 * 2, (run["name"], duplicates)
    assert 2 * steps - duplicates <= acked <= 2 * steps, (
        run["name"], acked, duplicates)
    assert run["max_step_gap_s"] > 0, run["name"]
    whats = [e["what"] for e in run["events"]]
    assert any(w.startswith("server 1 died") for w in whats), whats
    assert 0.5 < run["final_test_accuracy"] <= 1, run["final_test_accuracy"]
    # Restarted, server 1 copied both its ranges back (Repair).
    log = open(os.path.join(out, "logs", run["name"] + ".log")).read()
    assert log.count("this process holds the backup of the range") == 2, (
        run["name"])
print("compare_modes_test: server 1 killed under --replicas=1, nothing lost, "
      "its ranges repaired")
PY

# Both models on a data set of another image size and class count, with no
# config: 16x12 images of 3 classes (a bright bar in the top, middle or
# bottom band, on noise), their shape and classes read from the IDX files.
bars="${out}-bars-data"
/usr/bin/python3 - "$bars" <<'PY'
import gzip, os, random, struct, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = random.Random(7)
def write(prefix, n):
    images, labels = bytearray(), bytearray()
    for _ in range(n):
        label = rng.randrange(3)
        for row in range(16):
            for col in range(12):
                bright = 5 * label <= row < 5 * label + 5 and 2 <= col < 10
                images.append(rng.randrange(150, 256) if bright
                              else rng.randrange(0, 90))
        labels.append(label)
    with gzip.open(os.path.join(out, prefix + "-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 16, 12) + bytes(images))
    with gzip.open(os.path.join(out, prefix + "-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))
write("train", 1536)
write("t10k", 300)
PY
models="${out}-models"
"$compare" --model=mlp,lenet --modes=downpour --servers=1 --workers=2 \
  --epochs=2 --data_dir="$bars" --eval_interval_s=0.5 --target=0.9 \
  --straggler=1:1.5 \
  --report_script="$report" --out_dir="$models" \
  > "$models.log" 2>&1 || { cat "$models.log"; exit 1; }
/usr/bin/python3 - "$models" <<'PY'
import json, os, sys
out = sys.argv[1]
results = json.load(open(os.path.join(out, "results.json")))
names = [r["name"] for r in results["runs"]]
assert names == ["mlp-downpour-s1-w2", "lenet-downpour-s1-w2"], names
mlp, lenet = results["runs"]
assert mlp["model"] == "mlp" and lenet["model"] == "lenet", results["runs"]
assert mlp["variant"] == "mlp-downpour", mlp["variant"]
# The MLP's sizes and LeNet's shape come from the data: 192 values in,
# 3 classes out.
assert mlp["config"]["layer_sizes"] == [192, 256, 128, 3], mlp["config"]
assert mlp["network"]["input_shape"] == "1x1x192", mlp["network"]
assert lenet["network"]["input_shape"] == "16x12x1", lenet["network"]
assert lenet["network"]["layers"].startswith("conv 5x5x6 pad 2, relu, "
                                             "max_pool 2"), lenet["network"]
assert lenet["network"]["layers"].endswith("dense 3"), lenet["network"]
# 16x12 -> conv 16x12x6 -> pool 8x6 -> conv 4x2x16 -> pool 2x1x16 = 32
# values into dense 120.
assert lenet["network"]["parameters"] == (
    156 + 2416 + 32 * 120 + 120 + 120 * 84 + 84 + 84 * 3 + 3), lenet["network"]
# The whole resolved config, defaults included (64-bit integers as strings,
# as protobuf's JSON mapping writes them), and the comparison's scenario:
# enough to run it again.
assert lenet["config"]["layers"][0] == {"conv": {
    "filters": 6, "kernel": 5, "stride": 1, "padding": 2}}, lenet["config"]
assert lenet["config"]["input_shape"] == [16, 12, 1], lenet["config"]
assert lenet["config"]["mode"] == "DOWNPOUR", lenet["config"]
assert lenet["config"]["backup_workers"] == 0, lenet["config"]
assert lenet["config"]["seed"] == "1", lenet["config"]
scenario = results["scenario"]
assert scenario["stragglers"] == {"1": 1.5}, scenario
assert scenario["variants"] == ["downpour"], scenario
assert scenario["models"] == ["mlp", "lenet"], scenario
assert scenario["servers"] == [1] and scenario["workers"] == [2], scenario
assert scenario["target_accuracy"] == 0.9, scenario
for r in results["runs"]:
    assert r["final_test_accuracy"] >= 0.9, (r["name"], r["final_test_accuracy"])
print("compare_modes_test: mlp and lenet trained on 16x12 images of 3 "
      "classes with no config")
PY

# Elastic workers (--elastic): two workers join, one leaves and one is
# SIGKILLed during training. Nothing restarts; shard 0's data queue hands
# every data shard of every epoch out until it is done, those of the
# workers that went to the others. (On a loaded machine a joiner may still
# be loading its data when it is killed, or join after the data is all
# trained: the counts of joins and leaves are checked for what always
# holds. The downpour run trains for about 2 s here: the remove at 1 s,
# which is checked, leaves room for a machine twice as fast.)
elastic="${out}-elastic"
"$compare" --modes=sync,downpour --servers=2 --workers=2 --epochs=6 \
  --hidden=32 --eval_interval_s=1 --report_script="$report" --elastic \
  --out_dir="$elastic" \
  --chaos=add:worker@0.3s,add:worker@0.3s,remove:worker1@1s,kill:worker2@2s \
  > "$elastic.log" 2>&1 || { cat "$elastic.log"; exit 1; }
/usr/bin/python3 - "$elastic" <<'PY'
import json, os, sys
out = sys.argv[1]
results = json.load(open(os.path.join(out, "results.json")))
assert [r["name"] for r in results["runs"]] == [
    "sync-s2-w2", "downpour-s2-w2"], results["runs"]
for run in results["runs"]:
    assert run["elastic"], run["name"]
    assert run["restarts"] == 0, (run["name"], run["restarts"])
    # Every epoch's whole batches, each data shard done once.
    assert run["examples_trained"] == [60000 // 64 * 64] * 6, (
        run["name"], run["examples_trained"])
    whats = [e["what"] for e in run["events"]]
    assert whats.count("add worker 2 (joins the run)") == 1, whats
    assert "add worker 3 (joins the run)" in whats, whats
    assert any(w.startswith("remove worker 1") for w in whats), whats
    # The first two workers' joins and leaves (a finish, or rank 1's
    # remove), each a new membership epoch.
    assert run["membership_changes"] >= 4, (run["name"],
                                            run["membership_changes"])
    assert 0 <= run["join_to_first_push_s"] < 10, run["join_to_first_push_s"]
    assert 0.5 < run["final_test_accuracy"] <= 1, run["final_test_accuracy"]
print("compare_modes_test: elastic runs trained every data shard while "
      "workers joined, left and died")
PY
