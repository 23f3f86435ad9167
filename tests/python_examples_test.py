"""The monsoon package's example scripts (worker/python/examples) run as
their docstrings run them, under launch_local, briefly:
  - lenet_fashion_mnist.py in an elastic sync run that a worker joins: every
    example of the epoch trained, the model learns;
  - lstm_majority.py in a fixed downpour run: each rank trains its part, the
    model learns.
So an example that the package's API or the launchers leave behind fails
here. Skips where torch is not installed.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

RUNFILES = os.environ.get("TEST_SRCDIR", "")
LAUNCH_LOCAL = os.path.join(RUNFILES, "monsoon", "tools", "launch_local")
EXAMPLES = os.path.join(RUNFILES, "monsoon", "worker", "python", "examples")


@unittest.skipIf(torch is None, "python3-torch is not installed")
class PythonExamplesTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="monsoon-examples-")
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(sys.path)

    def launch(self, script, *flags):
        metrics_path = os.path.join(self.dir, script + ".json")
        run = subprocess.run(
            [LAUNCH_LOCAL,
             "--worker_cmd=%s %s" % (sys.executable,
                                     os.path.join(EXAMPLES, script)),
             "--servers=2", "--workers=2", "--eval_interval_s=1",
             "--metrics_port=0", "--metrics_out=" + metrics_path,
             "--work_dir=" + os.path.join(self.dir, script)] + list(flags),
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=400)
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        return json.load(open(metrics_path)), run.stdout

    def test_lenet_trains_in_an_elastic_run_that_a_worker_joins(self):
        metrics, out = self.launch(
            "lenet_fashion_mnist.py", "--model=lenet", "--mode=sync",
            "--epochs=1", "--elastic", "--chaos=add:worker@0.5s")
        self.assertIn("the script's model: 10 tensors, 61706 parameters", out)
        self.assertIn("add worker 2 (joins the run)", out)
        self.assertIn("data shards trained", out)
        # 60,000 examples in whole batches of 64, each once.
        self.assertEqual(metrics["examples_trained"], [59968])
        self.assertEqual(metrics["examples_trained_twice"], 0)
        self.assertGreater(metrics["final_test_accuracy"], 0.6)

    def test_lstm_trains_each_ranks_part_in_a_fixed_run(self):
        metrics, out = self.launch("lstm_majority.py", "--mode=downpour",
                                   "--epochs=1")
        # 24,000 sequences, each rank its half in whole batches of 64.
        self.assertEqual(metrics["samples"], 2 * (12000 // 64) * 64)
        self.assertEqual(metrics["samples_skipped"], 0)
        self.assertGreater(metrics["final_test_accuracy"], 0.2)


if __name__ == "__main__":
    unittest.main()
