"""compare_report's summary, from a given results file, with exact values."""

import json
import os
import tempfile
import unittest

from tools import compare_report

try:
    import matplotlib  # noqa: F401 (only whether it is there)
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False


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
            "pushed MB | pulled MB | total MB | staleness mean | "
            "staleness p99 |")
        self.assertEqual(
            lines[2],
            "| sync-s2-w2 | 0.8400 | 6.2 s | 1234 | 2.5 | 12.3 | 14.8 | 0.72 "
            "| 3 |")
        self.assertEqual(
            lines[3],
            "| onebit-s2-w2 | 0.8000 | not reached | 1234 | 2.5 | 12.3 | "
            "14.8 | 0.72 | 3 |")

    def test_a_lower_target_changes_time_to_target(self):
        rows = compare_report.summary_rows(RESULTS, target=0.8)
        self.assertEqual(rows[0]["time_to_target_s"], 4.5)
        self.assertEqual(rows[1]["time_to_target_s"], 4.0)

    def test_summary_says_when_the_delay_was_not_emulated(self):
        results = dict(RESULTS, link="100mbit,2ms", delay_emulated=False)
        self.assertIn("100mbit,2ms (rate shaped; this kernel has no netem",
                      compare_report.format_summary(results))

    def test_allreduce_counts_the_ring_in_total_mb(self):
        results = dict(RESULTS, runs=[
            run("allreduce-s2-w2", "allreduce", 2, [point(1.0, 0.9)],
                bytes_pushed=1000000, bytes_pulled=0,
                ring_bytes_sent=4000000)])
        table = compare_report.format_table(
            compare_report.summary_rows(results), 0.85)
        self.assertIn("| 1.0 | 0.0 | 5.0 |", table.splitlines()[2])

    def test_roofline_bounds_a_step_by_the_slowest_link(self):
        config = {"batch_size": 100}
        results = dict(RESULTS, link="100mbit,2ms", worker_rates={}, runs=[
            # 4 workers, 10 steps each: a ring of 1 MB sent per worker step
            # is 80 ms at 100 Mbit/s.
            run("allreduce-s2-w4", "allreduce", 4, [point(1.0, 0.9)],
                config=config, samples=4000, train_time_s=1.6,
                bytes_pushed=0, bytes_pulled=0, ring_bytes_sent=40000000),
            # 2 workers over 2 shards, 1 MB pushed and 1 MB pulled per
            # worker step: 80 ms on a worker's link, and each shard's link
            # carries 2 workers' halves, also 80 ms.
            run("sync-s2-w2", "sync", 2, [point(1.0, 0.9)], config=config,
                samples=2000, train_time_s=2.0, bytes_pushed=20000000,
                bytes_pulled=20000000),
        ])
        rows = compare_report.roofline_rows(results)
        self.assertEqual([r["run"] for r in rows],
                         ["allreduce-s2-w4", "sync-s2-w2"])
        self.assertAlmostEqual(rows[0]["bound_ms"], 80.0)
        self.assertAlmostEqual(rows[0]["measured_ms"], 160.0)
        self.assertAlmostEqual(rows[0]["ratio"], 2.0)
        self.assertAlmostEqual(rows[1]["bound_ms"], 80.0)
        self.assertAlmostEqual(rows[1]["measured_ms"], 200.0)
        # A worker on a 10 Mbit/s link (results.json's scenario says so)
        # bounds every run tenfold: every worker trains as many steps.
        slow = dict(results, scenario={"worker_rates": {"1": "10000000"}})
        self.assertEqual([r["bound_ms"] for r in
                          compare_report.roofline_rows(slow)],
                         [800.0, 800.0])
        summary = compare_report.format_summary(results)
        self.assertIn("## Against the link's bound", summary)
        self.assertIn("| allreduce-s2-w4 | 160.00 | 80.00 | 2.00x |", summary)
        self.assertEqual(compare_report.roofline_rows(RESULTS), [])

    def test_failed_runs_are_listed_with_their_error(self):
        self.assertEqual(compare_report.format_failed([]), "")
        self.assertEqual(
            compare_report.format_failed([
                {"name": "allreduce-s2-w2", "failed": "worker 1 exited"}]),
            "\n## Runs that failed\n\n- allreduce-s2-w2: worker 1 exited\n")

    def test_summary_says_when_proxies_made_the_delay(self):
        results = dict(RESULTS, link="100mbit,2ms", delay_emulated=True,
                       delay_method="proxy")
        self.assertIn("100mbit,2ms (rate shaped with tbf, delay added by "
                      "user-space proxies)",
                      compare_report.format_summary(results))

    def test_medians_over_seeds_per_variant_with_their_spread(self):
        def seeded(variant, seed, reach, accuracy, rate):
            curve = [point(1.0, 0.5), point(reach, 0.9)] if reach else [
                point(1.0, 0.5)]
            r = run("%s-s2-w2-seed%d" % (variant, seed), "sync", 2, curve,
                    variant=variant, seed=seed, samples_per_s=rate)
            r["final_test_accuracy"] = accuracy
            return r
        results = dict(RESULTS, runs=[
            seeded("sync", 1, 10.0, 0.86, 100.0),
            seeded("sync", 2, 30.0, 0.88, 300.0),
            seeded("sync", 3, 20.0, 0.87, 200.0),
            seeded("sync+backup_workers=1", 1, 5.0, 0.85, 400.0),
            seeded("sync+backup_workers=1", 2, None, 0.84, 500.0),
        ])
        rows = compare_report.variant_medians(results, 0.85)
        self.assertEqual(len(rows), 2)
        self.assertEqual(rows[0]["variant"], "sync")
        self.assertEqual(rows[0]["time_to_target_s"], 20.0)
        self.assertEqual(rows[0]["time_spread"], (10.0, 30.0))
        self.assertEqual(rows[0]["final_test_accuracy"], 0.87)
        self.assertEqual(rows[0]["samples_per_s"], 200.0)
        self.assertEqual((rows[1]["reached"], rows[1]["seeds"]), (1, 2))
        self.assertEqual(rows[1]["time_to_target_s"], 5.0)
        self.assertEqual(rows[1]["final_test_accuracy"], 0.845)
        table = compare_report.format_medians(rows, 0.85).splitlines()
        self.assertEqual(
            table[2], "| sync (2 servers, 2 workers) | 3 of 3 | "
            "20.0 s (10.0-30.0) | 0.8700 (0.8600-0.8800) | 200 |")
        self.assertIn("## Medians over seeds",
                      compare_report.format_summary(results, 0.85))
        # Without seeds, no such table.
        self.assertEqual(compare_report.variant_medians(RESULTS), [])

    def test_click_runs_get_final_auc_columns_with_their_spread(self):
        def click(mode, seed, auc):
            curve = [dict(point(1.0, 0.7), test_auc=auc - 0.1),
                     dict(point(2.0, 0.75), test_auc=auc)]
            return run("sparse_lr-%s-s2-w2-seed%d" % (mode, seed), mode, 2,
                       curve, variant=mode, seed=seed, final_test_auc=auc)
        results = dict(RESULTS, runs=[click("sync", 1, 0.74),
                                      click("sync", 2, 0.7450),
                                      click("sync", 3, 0.73),
                                      click("downpour", 1, 0.72)])
        table = compare_report.format_table(
            compare_report.summary_rows(results), 0.85).splitlines()
        self.assertEqual(table[0].split(" | ")[1:3],
                         ["final test accuracy", "final test AUC"])
        self.assertEqual(table[1], "|" + "---|" * 10)
        self.assertEqual(table[2].split(" | ")[1:3], ["0.7500", "0.7400"])
        rows = compare_report.variant_medians(results, 0.85)
        self.assertEqual(rows[0]["final_test_auc"], 0.74)
        self.assertEqual(rows[0]["auc_spread"], (0.73, 0.745))
        medians = compare_report.format_medians(rows, 0.85).splitlines()
        self.assertEqual(
            medians[2], "| sync (2 servers, 2 workers) | 0 of 3 | not reached "
            "| 0.7500 (0.7500-0.7500) | 0.7400 (0.7300-0.7450) | 1234 |")
        self.assertEqual(medians[1], "|---|---|---|---|---|---|")
        # Dense runs keep their columns.
        self.assertNotIn("AUC", compare_report.format_table(
            compare_report.summary_rows(RESULTS), 0.85))

    def test_legends_name_the_runs_where_modes_repeat(self):
        a = run("sync-s2-w2 float32", "sync", 2, [point(1.0, 0.5)])
        b = run("sync-s2-w2 two-way 1-bit", "sync", 2, [point(1.0, 0.5)])
        self.assertEqual(compare_report._label(a, False), "sync")
        self.assertEqual(compare_report._label(a, False, same_modes=True),
                         "sync-s2-w2 float32")
        self.assertEqual(compare_report._label(b, False, same_modes=True),
                         "sync-s2-w2 two-way 1-bit")
        self.assertEqual(compare_report._label(a, True),
                         "sync (2 servers, 2 workers)")

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
        self.assertEqual(lines[1], "|" + "---|" * 10)
        self.assertTrue(lines[2].endswith("| 3 | 2 kills, 1 stop, 2 restarts |"))
        self.assertTrue(lines[3].endswith("| 3 | none |"))
        self.assertIn("Faults injected into every run: kill:server1@1.5s.",
                      compare_report.format_summary(results))

    def test_elastic_runs_count_workers_added_and_removed(self):
        events = [
            {"time_s": 2.0, "what": "add worker 2 (joins the run)"},
            {"time_s": 2.0, "what": "add worker 3 (joins the run)"},
            {"time_s": 5.0, "what": "remove worker 1 (SIGTERM: it ends its "
                                    "step and leaves)"},
            {"time_s": 6.5, "what": "worker 1 left"},
            {"time_s": 7.0, "what": "kill worker 2 (SIGKILL)"},
        ]
        results = dict(RESULTS, runs=[
            run("sync-s2-w2", "sync", 2, [point(9.0, 0.87)], events=events),
        ])
        rows = compare_report.summary_rows(results)
        self.assertEqual(rows[0]["faults"], "2 adds, 1 remove, 1 kill")

    def test_main_writes_summary_md(self):
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "results.json")
            with open(path, "w") as f:
                json.dump(RESULTS, f)
            self.assertEqual(
                compare_report.main(["--results", path, "--out_dir", out]), 0)
            with open(os.path.join(out, "summary.md")) as f:
                self.assertIn("| sync-s2-w2 | 0.8400 | 6.2 s |", f.read())

    def test_staleness_fractions_divide_each_count_by_all_pushes(self):
        self.assertEqual(
            compare_report.staleness_fractions(
                run("a", "hogwild", 2, [point(1, 0.5)],
                    staleness_histogram=[2, 5, 0, 1])),
            [0.25, 0.625, 0.0, 0.125])
        self.assertEqual(
            compare_report.staleness_fractions(
                run("b", "sync", 2, [point(1, 0.5)],
                    staleness_histogram=[40])), [1.0])

    def test_staleness_fractions_are_none_without_pushes_or_the_field(self):
        for extra in ({}, {"staleness_histogram": []},
                      {"staleness_histogram": [0, 0]}):
            self.assertIsNone(compare_report.staleness_fractions(
                run("a", "sync", 2, [point(1, 0.5)], **extra)), extra)

    def test_step_phases_are_ms_per_compute_step_in_step_order(self):
        # downpour with n_fetch 4: 100 steps, 25 pulls.
        phases = {
            "push": {"seconds": 0.5, "count": 100, "mean_ms": 5.0},
            "compute": {"seconds": 1.0, "count": 100, "mean_ms": 10.0},
            "pull": {"seconds": 0.25, "count": 25, "mean_ms": 10.0},
        }
        self.assertEqual(
            compare_report.step_phase_ms(
                run("a", "downpour", 2, [point(1, 0.5)], step_phases=phases)),
            [("compute", 10.0), ("pull", 2.5), ("push", 5.0)])
        # Without "compute" a step is the most frequent phase; a phase not
        # in PHASE_ORDER goes last.
        phases = {
            "wait": {"seconds": 0.25, "count": 10, "mean_ms": 25.0},
            "push_pull": {"seconds": 2.0, "count": 40, "mean_ms": 50.0},
        }
        self.assertEqual(
            compare_report.step_phase_ms(
                run("a", "sync", 2, [point(1, 0.5)], step_phases=phases)),
            [("push_pull", 50.0), ("wait", 6.25)])

    def test_step_phases_are_empty_without_the_field_or_steps(self):
        for extra in ({}, {"step_phases": {}},
                      {"step_phases": {"compute": {"seconds": 0, "count": 0,
                                                   "mean_ms": 0}}}):
            self.assertEqual(compare_report.step_phase_ms(
                run("a", "sync", 2, [point(1, 0.5)], **extra)), [], extra)

    @unittest.skipUnless(HAVE_MATPLOTLIB, "no matplotlib")
    def test_main_draws_staleness_and_phase_plots_when_a_run_has_them(self):
        results = dict(RESULTS, runs=[
            run("sync-s2-w2", "sync", 2, [point(1, 0.5)],
                staleness_histogram=[8],
                step_phases={"compute": {"seconds": 1, "count": 10,
                                         "mean_ms": 100},
                             "push_pull": {"seconds": 2, "count": 10,
                                           "mean_ms": 200}}),
            RESULTS["runs"][1],  # neither field: left out of both plots
        ])
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "results.json")
            with open(path, "w") as f:
                json.dump(results, f)
            self.assertEqual(
                compare_report.main(["--results", path, "--out_dir", out]), 0)
            for name in ("staleness_distribution.png",
                         "step_time_by_phase.png", "accuracy_vs_time.png"):
                with open(os.path.join(out, name), "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", name)

    @unittest.skipUnless(HAVE_MATPLOTLIB, "no matplotlib")
    def test_main_skips_the_new_plots_for_results_without_their_fields(self):
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "results.json")
            with open(path, "w") as f:
                json.dump(RESULTS, f)
            self.assertEqual(
                compare_report.main(["--results", path, "--out_dir", out]), 0)
            written = set(os.listdir(out))
            self.assertIn("accuracy_vs_time.png", written)
            self.assertNotIn("staleness_distribution.png", written)
            self.assertNotIn("step_time_by_phase.png", written)

    def test_main_reports_a_corrupt_results_file(self):
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "results.json")
            with open(path, "w") as f:
                f.write("{not json")
            self.assertEqual(
                compare_report.main(["--results", path, "--out_dir", out]), 1)


if __name__ == "__main__":
    unittest.main()
