"""compare_report's summary, from a given results file, with exact values."""

import json
import os
import tempfile
import unittest

from tools import compare_report


def run(name, mode, workers, curve, **extra):
    values = {
        "name": name, "mode": mode, "servers": 2, "workers": workers,
        "final_test_accuracy": curve[-1]["test_accuracy"],
        "samples_per_s": 1234.5, "bytes_pushed": 2500000,
        "bytes_pulled": 12345678,
        "staleness": {"mean": 0.725, "p50": 1, "p99": 3, "max": 4},
        "curve": curve,
    }
    values.update(extra)
    return values


def point(t, accuracy, samples=0, loss=1.0, pushed=0):
    return {"time_s": t, "samples": samples, "test_accuracy": accuracy,
            "test_loss": loss, "bytes_pushed": pushed, "bytes_pulled": 0}


RESULTS = {
    "target_accuracy": 0.85,
    "link": "loopback",
    "delay_emulated": True,
    "runs": [
        run("sync-s2-w2", "sync", 2,
            [point(2.0, 0.70), point(4.5, 0.849), point(6.25, 0.85),
             point(8.0, 0.84)]),
        run("onebit-s2-w2", "onebit", 2,
            [point(2.0, 0.60), point(4.0, 0.80)]),
    ],
}


class CompareReportTest(unittest.TestCase):

    def test_time_to_target_is_the_first_point_at_or_above_it(self):
        curve = RESULTS["runs"][0]["curve"]
        self.assertEqual(compare_report.time_to_target(curve, 0.85), 6.25)
        self.assertEqual(compare_report.time_to_target(curve, 0.70), 2.0)
        self.assertIsNone(compare_report.time_to_target(curve, 0.9))
        self.assertIsNone(compare_report.time_to_target([], 0.1))

    def test_rows_take_final_accuracy_and_counters_from_each_run(self):
        rows = compare_report.summary_rows(RESULTS)
        self.assertEqual([r["run"] for r in rows],
                         ["sync-s2-w2", "onebit-s2-w2"])
        self.assertEqual(rows[0]["final_test_accuracy"], 0.84)
        self.assertEqual(rows[0]["time_to_target_s"], 6.25)
        self.assertIsNone(rows[1]["time_to_target_s"])
        self.assertEqual(rows[1]["staleness_p99"], 3)

    def test_table_formats_every_column(self):
        table = compare_report.format_table(
            compare_report.summary_rows(RESULTS), 0.85)
        lines = table.splitlines()
        self.assertEqual(
            lines[0],
            "| run | final test accuracy | time to 0.85 | samples/s | "
            "pushed MB | pulled MB | staleness mean | staleness p99 |")
        self.assertEqual(
            lines[2],
            "| sync-s2-w2 | 0.8400 | 6.2 s | 1234 | 2.5 | 12.3 | 0.72 | 3 |")
        self.assertEqual(
            lines[3],
            "| onebit-s2-w2 | 0.8000 | not reached | 1234 | 2.5 | 12.3 | "
            "0.72 | 3 |")

    def test_a_lower_target_changes_time_to_target(self):
        rows = compare_report.summary_rows(RESULTS, target=0.8)
        self.assertEqual(rows[0]["time_to_target_s"], 4.5)
        self.assertEqual(rows[1]["time_to_target_s"], 4.0)

    def test_summary_says_when_the_delay_was_not_emulated(self):
        results = dict(RESULTS, link="100mbit,2ms", delay_emulated=False)
        self.assertIn("100mbit,2ms (rate shaped; this kernel has no netem",
                      compare_report.format_summary(results))

    def test_faults_get_a_column_counting_each_runs_kills_stops_restarts(self):
        events = [
            {"time_s": 1.5, "what": "kill server 1 (SIGKILL)"},
            {"time_s": 1.5, "what": "server 1 exited with code 137; "
                                    "restarting it in 1s (restart 1 of at "
                                    "most 3)"},
            {"time_s": 2.5, "what": "restarted server 1"},
            {"time_s": 3.0, "what": "stop server 0 (SIGSTOP) for 2 s"},
            {"time_s": 5.0, "what": "continue server 0 (SIGCONT)"},
            {"time_s": 6.0, "what": "kill worker 0 (SIGKILL)"},
        ]
        results = dict(RESULTS, chaos="kill:server1@1.5s", runs=[
            run("downpour-s2-w2", "downpour", 2, [point(9.0, 0.87)],
                events=events, restarts=2),
            RESULTS["runs"][1],
        ])
        rows = compare_report.summary_rows(results)
        self.assertEqual(rows[0]["faults"], "2 kills, 1 stop, 2 restarts")
        self.assertEqual(rows[1]["faults"], "")
        lines = compare_report.format_table(rows, 0.85).splitlines()
        self.assertTrue(lines[0].endswith("| staleness p99 | faults |"))
        self.assertEqual(lines[1], "|" + "---|" * 9)
        self.assertTrue(lines[2].endswith("| 3 | 2 kills, 1 stop, 2 restarts |"))
        self.assertTrue(lines[3].endswith("| 3 | none |"))
        self.assertIn("Faults injected into every run: kill:server1@1.5s.",
                      compare_report.format_summary(results))

    def test_main_writes_summary_md(self):
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "results.json")
            with open(path, "w") as f:
                json.dump(RESULTS, f)
            self.assertEqual(
                compare_report.main(["--results", path, "--out_dir", out]), 0)
            with open(os.path.join(out, "summary.md")) as f:
                self.assertIn("| sync-s2-w2 | 0.8400 | 6.2 s |", f.read())

    def test_main_reports_a_corrupt_results_file(self):
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "results.json")
            with open(path, "w") as f:
                f.write("{not json")
            self.assertEqual(
                compare_report.main(["--results", path, "--out_dir", out]), 1)


if __name__ == "__main__":
    unittest.main()
