#!/usr/bin/env bash
# compare_modes --model=sparse_lr on a small generated click data set: the
# daemons train and evaluate the sparse model in two modes, and the results
# carry the click model's AUC (every curve point, the final one, the
# table's column) and the exact examples trained.
set -euo pipefail
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
compare="$1"
report="$2"
make_data="$3"
"$make_data" --out="$tmp/click" --examples=4000 --test_examples=1000 \
  --id_scale=0.001 --seed=2 > "$tmp/data.log" 2>&1 || { cat "$tmp/data.log"; exit 1; }
out="$tmp/cmp"
"$compare" --model=sparse_lr --data_dir="$tmp/click" --modes=sync,downpour \
  --servers=2 --workers=2 --epochs=2 --batch_size=100 --eval_interval_s=1 \
  --report_script="$report" --out_dir="$out" > "$out.log" 2>&1 || {
  cat "$out.log"; exit 1; }

/usr/bin/python3 - "$out" "$tmp/click/planted.json" <<'PY'
import json, os, sys
out, planted_path = sys.argv[1], sys.argv[2]
planted = json.load(open(planted_path))
results = json.load(open(os.path.join(out, "results.json")))
names = [r["name"] for r in results["runs"]]
assert names == ["sparse_lr-sync-s2-w2", "sparse_lr-downpour-s2-w2"], names
for r in results["runs"]:
    assert r["config"]["model"] == "SPARSE_LR", r["config"]["model"]
    # 2 workers, 2000 examples each, 20 whole batches of 100, 2 epochs.
    assert r["samples"] == 2 * 2 * 20 * 100, r["samples"]
    assert r["curve"] and all("test_auc" in p for p in r["curve"]), r["curve"]
    assert r["final_test_auc"] == r["curve"][-1]["test_auc"], r
    assert r["final_test_logloss"] == r["final_test_loss"], r
    # It learns: above chance, below what the planted model knows.
    assert 0.55 < r["final_test_auc"] < planted["test_auc"], (
        r["final_test_auc"], planted["test_auc"])
    # Every example was trained, so the table made a row for each
    # categorical id the generator drew for training, no more.
    table = r["sparse_tables"]["weights"]
    assert table["rows"] == planted["train_ids"], (table, planted["train_ids"])
    assert table["row_updates"] >= 2 * table["rows"], table  # 2 epochs
    # Rows are pushed and pulled: far more bytes than the 64 dense values'.
    assert r["bytes_pushed"] > 2 * r["pushes"] * 64 * 4, r
# sync: every dense push of the 2 x 40 steps at staleness 0, on each shard.
sync = results["runs"][0]
assert sync["pushes"] == 80, sync["pushes"]
assert sync["staleness_histogram"] == [2 * 80], sync["staleness_histogram"]
summary = open(os.path.join(out, "summary.md")).read()
assert "| final test AUC |" in summary, summary
assert "| sparse_lr-sync-s2-w2 |" in summary, summary
if os.path.exists(os.path.join(out, "accuracy_vs_time.png")):  # matplotlib
    for png in ("auc_vs_time.png", "auc_vs_bytes_moved.png"):
        assert os.path.getsize(os.path.join(out, png)) > 0, png
PY
echo "PASS"
