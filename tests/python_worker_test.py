"""PyTorch scripts as Monsoon workers (monsoon.torch), against real shards.

Each test starts ps_server processes on loopback with a config written by
monsoon.torch.export_layout, runs the worker script below once per rank as
its own python3 process (the way launchers run them), and checks what the
workers end with:
  - sync: both workers end with bit-identical weights, equal to plain
    PyTorch's SGD on the mean of the two ranks' gradients, step by step;
  - every other mode: the run ends, and the model has learned (a separable
    task: the loss on a fixed set falls well below its start);
  - the wrapped optimizer's weight decay and a scheduler's rate reach the
    shards' rule (sync: plain PyTorch's SGD with both), and rank 0 says
    where the wrapped optimizer and the run's config part;
  - a parameter with no gradient pushes zeros and nothing hangs; gradients
    of their own (set_to_none, sparse embeddings) push as dense ones;
  - the model's parameters share memory with what the C++ side pulls into;
  - a model whose names, shapes or order differ is refused naming the first
    difference; calls before init() and non-float32 parameters are refused;
  - the script as the evaluator (BatchNorm's statistics recomputed over
    the training inputs it is given), and under launch_local --worker_cmd;
  - SIGTERM ends a worker after its step, with its report, exit 143;
  - elastic runs: scripts train the batches of shard 0's data shards, every
    example of every epoch once, while workers join and leave; a step
    without a batch and a batch taken ahead of training are refused.
Skips where torch is not installed.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

RUNFILES = os.environ.get("TEST_SRCDIR", "")
PS_SERVER = os.path.join(RUNFILES, "monsoon", "server", "ps_server")
LAUNCH_LOCAL = os.path.join(RUNFILES, "monsoon", "tools", "launch_local")
COMPARE_MODES = os.path.join(RUNFILES, "monsoon", "tools", "compare_modes")

WORKER = r'''
import json, sys
import torch
import torch.nn.functional as F
import monsoon.torch as mt

steps, extra, lr = int(sys.argv[1]), sys.argv[2] == "extra", float(sys.argv[3])
# What the script does between zero_grad() and step(): plain; clip (the
# gradients scaled in place after backward); twice (two backward passes
# summed); short (a last batch of 5 examples); decay (weight decay 0.01 on
# the wrapped SGD, and a scheduler on the DistributedOptimizer halving its
# rate every 2 steps); decay_frozen (the same, the first layer's weights
# frozen); leave (mt.finish(finished=False) at the end); no_finish (no
# mt.finish() at the end); crash (an uncaught
# exception after the steps); none (model.zero_grad(set_to_none=True), torch 2's
# default, in place of opt.zero_grad()).
variant = sys.argv[4] if len(sys.argv) > 4 else "plain"
mt.init()
torch.manual_seed(0)
kind = sys.argv[5] if len(sys.argv) > 5 else "narrow"
if kind == "wide":  # wide_model()
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU(),
                                torch.nn.Linear(2, 20))
elif kind == "bn":  # bn_model()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 2))
elif kind.endswith("embedding"):  # embedding_model()
    model = torch.nn.Sequential(
        torch.nn.Embedding(16, 4, sparse=kind == "sparse_embedding"),
        torch.nn.Flatten(), torch.nn.Linear(8, 12))
else:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2))
if extra:  # a parameter that gets no gradient
    model.register_parameter("unused", torch.nn.Parameter(torch.ones(3)))
decay = variant.startswith("decay")
if variant == "decay_frozen":  # the first layer's weights frozen
    model[0].weight.requires_grad_(False)
opt = mt.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=lr,
                    weight_decay=0.01 if decay else 0),
    named_parameters=model.named_parameters())
if decay:
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
with torch.no_grad():  # the pull must land in the parameters' own memory
    for p in model.parameters():
        p.fill_(123.0)
mt.broadcast_parameters(model)
start = [p.detach().clone() for p in model.parameters()]
g = torch.Generator().manual_seed(100 + mt.rank())
for step in range(steps):
    batch = 5 if variant == "short" and step == steps - 1 else 8
    x = torch.randn(batch, 4, generator=g)
    y = (x[:, 0] > 0).long()
    if kind.endswith("embedding"):  # two ids an example, repeats among them
        x = (x[:, :2].abs() * 4).long().clamp(max=15)
    if variant == "none":
        model.zero_grad(set_to_none=True)
    else:
        opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    if variant == "twice":
        F.cross_entropy(model(x[:4]), y[:4]).backward()
    if variant == "clip":
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    opt.step(samples=batch)
    if decay:
        schedule.step()
pushed_during_backward = opt._worker.shard_pushes_during_backward
hooks = len(opt._accumulators)
withdrawn = opt._overlap_withdrawn
if variant == "crash":
    raise RuntimeError("the script failed after its steps")
if variant == "leave":  # leaves without finishing, as a killed one would
    mt.finish(finished=False)
elif variant != "no_finish":
    mt.finish()
print("RESULT " + json.dumps({
    "names": [name for name, _ in model.named_parameters()],
    "params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
    "start": [p.reshape(-1).tolist() for p in start],
    "steps": opt.steps,
    "resume_point": mt.resume_point(),
    "pushed_during_backward": pushed_during_backward,
    "hooks": hooks,
    "withdrawn": withdrawn}))
'''


# The tests' model and its evaluation, as a script's first lines.
SCRIPT_MODEL = r'''
import json, sys
import torch
import torch.nn.functional as F
import monsoon.torch as mt

mt.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                            torch.nn.Linear(8, 2))

def evaluate(m):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, 4, generator=g)
    y = (x[:, 0] > 0).long()
    with torch.no_grad():
        out = m(x)
        return ((out.argmax(1) == y).float().mean().item(),
                F.cross_entropy(out, y).item())
'''

EVALUATOR = SCRIPT_MODEL + r'''
assert mt.is_evaluator()
points = mt.evaluate_every(model, evaluate, interval_s=0.2)
print("RESULT " + json.dumps({
    "points": points,
    "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}))
'''

# The evaluator of bn_model() (see the test), with bn_batches() or, given
# "none", without.
EVALUATOR_BN = SCRIPT_MODEL + r'''
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                            torch.nn.ReLU(), torch.nn.Linear(8, 2))
g = torch.Generator().manual_seed(11)
batches = [torch.randn(64, 4, generator=g) for _ in range(2)]
points = mt.evaluate_every(model, evaluate, interval_s=0.2,
                           bn_batches=None if sys.argv[1:] == ["none"]
                           else batches)
print("RESULT " + json.dumps({"points": points}))
'''

# Run by launch_local --worker_cmd: the evaluator, or a worker of 30 steps
# (or argv[1] steps, each followed by a pause of argv[2] seconds).
LAUNCHED = SCRIPT_MODEL + r'''
import time
if mt.is_evaluator():
    mt.evaluate_every(model, evaluate)
    sys.exit(0)
steps, pause = ((int(sys.argv[1]), float(sys.argv[2])) if len(sys.argv) > 2
                else (30, 0))
opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                              named_parameters=model.named_parameters())
mt.broadcast_parameters(model)
g = torch.Generator().manual_seed(100 + mt.rank())
for step in range(steps):
    x = torch.randn(8, 4, generator=g)
    y = (x[:, 0] > 0).long()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step(samples=8)
    time.sleep(pause)
mt.finish()
'''




# An elastic run's worker under launch_local --elastic: trains the batches of
# mt.Batches over a set of 240 examples, pausing argv[1] seconds
# after each, and appends each batch it steps to the file argv[2]-RANK, a
# JSON line: epoch, batch, batches per epoch, indices, and digests of the
# weights before and after the step. Given argv[3] and argv[4], the
# workers start together (each waits until argv[4] have registered), and
# the first worker to take batch 26 of the last epoch (its last data shard
# holds batches 24 to 29) writes its rank to argv[2]-died, holds the shard
# argv[3] seconds and dies (SIGKILL).
ELASTIC = SCRIPT_MODEL + r'''
import collections, hashlib, os, signal, time
def digest():
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha1(flat.numpy().tobytes()).hexdigest()[:16]
if mt.is_evaluator():
    mt.evaluate_every(model, evaluate)
    sys.exit(0)
pause, log = float(sys.argv[1]), open(sys.argv[2] + "-%d" % mt.rank(), "a")
opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                              named_parameters=model.named_parameters())
mt.broadcast_parameters(model)
assert mt.is_elastic()
g = torch.Generator().manual_seed(5)
data_x = torch.randn(240, 4, generator=g)
data_y = (data_x[:, 0] > 0).long()
batches = mt.Batches(len(data_x))
given = collections.deque()  # (epoch, batch, per epoch) of each batch taken
def labelled():
    for indices in batches:
        given.append((batches.epoch, batches.batch, batches.batches_per_epoch))
        yield indices
loader = labelled()
if os.environ.get("ELASTIC_TEST_LOADER"):
    # Batches ahead of training: a DataLoader's worker processes prefetch.
    class Indexed(torch.utils.data.Dataset):
        def __len__(self):
            return len(data_x)
        def __getitem__(self, i):
            return i
    loader = torch.utils.data.DataLoader(Indexed(), batch_sampler=labelled(),
                                         num_workers=2)
if len(sys.argv) > 4:
    open(sys.argv[2] + "-ready-%d" % mt.rank(), "w").close()
    while len([f for f in os.listdir(os.path.dirname(sys.argv[2]))
               if "-ready-" in f]) < int(sys.argv[4]):
        time.sleep(0.01)
for indices in loader:
    epoch, batch, per_epoch = given.popleft()
    if (len(sys.argv) > 3 and batch == 26 and
            epoch == mt.run_config()["epochs"] - 1):
        try:
            died = os.open(sys.argv[2] + "-died", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(died, str(mt.rank()).encode())
            os.close(died)
            time.sleep(float(sys.argv[3]))
            os.kill(os.getpid(), signal.SIGKILL)
        except FileExistsError:
            pass
    before = digest()
    opt.zero_grad()
    F.cross_entropy(model(data_x[indices]), data_y[indices]).backward()
    opt.step()
    log.write(json.dumps({"epoch": epoch, "batch": batch,
                          "per_epoch": per_epoch,
                          "indices": indices.tolist(), "before": before,
                          "after": digest()}) + "\n")
    log.flush()
    time.sleep(pause)
mt.finish()
'''

# A fixed run's worker: trains the batches of mt.Batches over a set of 240
# examples, appending each batch's indices to argv[1]-RANK as it steps it;
# given argv[2] > 0, leaves after that many steps without finishing (as one
# that died would); given argv[3] "loader", through a DataLoader with
# worker processes, which takes batches ahead.
FIXED_BATCHES = SCRIPT_MODEL + r'''
log, stop_after = open(sys.argv[1] + "-%d" % mt.rank(), "a"), int(sys.argv[2])
opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                              named_parameters=model.named_parameters())
mt.broadcast_parameters(model)
g = torch.Generator().manual_seed(5)
data_x = torch.randn(240, 4, generator=g)
data_y = (data_x[:, 0] > 0).long()
batches = mt.Batches(len(data_x))
loader = batches
if sys.argv[3:] == ["loader"]:
    # Batches ahead of training: a DataLoader's worker processes prefetch.
    class Indexed(torch.utils.data.Dataset):
        def __len__(self):
            return len(data_x)
        def __getitem__(self, i):
            return i
    loader = torch.utils.data.DataLoader(Indexed(), batch_sampler=batches,
                                         num_workers=2)
for indices in loader:
    opt.zero_grad()
    F.cross_entropy(model(data_x[indices]), data_y[indices]).backward()
    opt.step()
    log.write(json.dumps([indices.tolist()]) + "\n")
    log.flush()
    if opt.steps == stop_after:
        mt.finish(finished=False)
        sys.exit(0)
mt.finish()
'''

# Misuses an elastic run (or, given "fixed", a fixed one) and prints what
# each was told.
ELASTIC_MISUSE = SCRIPT_MODEL + r'''
opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                              named_parameters=model.named_parameters())
mt.broadcast_parameters(model)
x = torch.randn(8, 4)
y = (x[:, 0] > 0).long()
def step(n=8):
    opt.zero_grad()
    F.cross_entropy(model(x[:n]), y[:n]).backward()
    opt.step(samples=n)
told = {}
def attempt(what, f):
    try:
        f()
        told[what] = "ok"
    except mt.Error as e:
        told[what] = str(e)
if sys.argv[1:] == ["fixed"]:
    attempt("own step", step)  # a fixed run's own split: the script's
    attempt("batches after own steps", lambda: next(iter(mt.Batches(240))))
else:
    attempt("step without a batch", step)
    batches = iter(mt.Batches(240))
    attempt("first batch", lambda: next(batches))
    attempt("a batch ahead", lambda: next(batches))
    attempt("other size", lambda: next(iter(mt.Batches(256))))
    attempt("part of a batch", lambda: step(5))
print("RESULT " + json.dumps(told))
mt.finish(finished=False)
'''

# Trains until SIGTERM; says it has taken a step by writing a file.
ENDLESS = SCRIPT_MODEL + r'''
import os, time
opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                              named_parameters=model.named_parameters())
mt.broadcast_parameters(model)
g = torch.Generator().manual_seed(100 + mt.rank())
while True:
    x = torch.randn(8, 4, generator=g)
    y = (x[:, 0] > 0).long()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step(samples=8)
    if opt.steps == 1:
        open(sys.argv[1] + "-%d" % mt.rank(), "w").close()
    time.sleep(0.005)
'''


def model_for_test():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2))


def wide_model():
    # 70 values whose last layer (60 from 10) fills shard 1 of 2, [35, 70).
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU(),
                               torch.nn.Linear(2, 20))


def bn_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 2))


def bn_batches():
    # The training inputs over which an evaluator recomputes BatchNorm's
    # statistics.
    g = torch.Generator().manual_seed(11)
    return [torch.randn(64, 4, generator=g) for _ in range(2)]


def embedding_model(sparse):
    # 64 + 108 values: on 2 shards, [0, 86) and [86, 172), shard 1's range
    # in the last layer, whose gradients are final before the table's.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(16, 4, sparse=sparse),
                               torch.nn.Flatten(), torch.nn.Linear(8, 12))


def eval_loss(model):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, 4, generator=g)
    y = (x[:, 0] > 0).long()
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(x), y).item()


def load_flat(model, flat):
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            n = p.numel()
            p.copy_(torch.tensor(flat[offset:offset + n]).view_as(p))
            offset += n


def plain_sync_steps(steps, weight_decay=0.0, halve_every=None):
    """The tests' sync run of 2 workers in plain PyTorch: each rank's
    gradient on the same weights, averaged, then PyTorch's SGD (lr 0.1,
    `weight_decay`) with, given `halve_every`, a StepLR halving the rate
    every that many steps. The weights at the end, as the workers print
    them."""
    model = model_for_test()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=weight_decay)
    schedule = (torch.optim.lr_scheduler.StepLR(sgd, step_size=halve_every,
                                                gamma=0.5)
                if halve_every else None)
    gens = [torch.Generator().manual_seed(100 + r) for r in range(2)]
    for _ in range(steps):
        grads = []
        for g in gens:
            x = torch.randn(8, 4, generator=g)
            y = (x[:, 0] > 0).long()
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = (grads[0][i] + grads[1][i]) / 2
        sgd.step()
        if schedule is not None:
            schedule.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


@unittest.skipIf(torch is None, "python3-torch is not installed")
class PythonWorkerTest(unittest.TestCase):

    def assertParamsClose(self, got, want):
        for got_tensor, want_tensor in zip(got, want):
            for a, b in zip(got_tensor, want_tensor):
                self.assertAlmostEqual(a, b, delta=1e-6)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="monsoon-py-")
        self.servers = []
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(sys.path)
        self.script = self.write_script("worker.py", WORKER)

    def tearDown(self):
        for server in self.servers:
            server.terminate()
        for server in self.servers:
            server.wait(timeout=30)

    def write_script(self, name, text):
        """Writes `text` to `name` in the test's folder; returns its path."""
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def script_env(self, servers, config, rank, workers=None, **more):
        """The environment of a script that the test starts as `rank` (-1:
        the evaluator) of the run on `servers` with `config`, as a launcher
        would give it, plus the MONSOON_* variables in `more`."""
        env = dict(self.env, MONSOON_SERVERS=servers, MONSOON_RANK=str(rank),
                   MONSOON_CONFIG=config, MONSOON_CONNECT_TIMEOUT_S="20",
                   **more)
        if workers is not None:
            env["MONSOON_NUM_WORKERS"] = str(workers)
        return env

    def launch(self, script, *flags, args="", timeout=300):
        """Runs launch_local with --worker_cmd `script` (with `args`),
        `flags`, and its folder under the test's (self.dir/run); the ended
        process, its output (stdout and stderr) as text."""
        command = " ".join(filter(None, [sys.executable, script, args]))
        return subprocess.run(
            [LAUNCH_LOCAL, "--worker_cmd=" + command, *flags,
             "--work_dir=" + os.path.join(self.dir, "run")],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=timeout)

    def wait_while_running(self, proc, log_path, ready, deadline):
        """Waits until ready() is true, failing if `proc` (logging to
        log_path) exits first or `deadline` passes."""
        while not ready():
            log = open(log_path).read()
            self.assertLess(time.time(), deadline, log)
            self.assertIsNone(proc.poll(), log)
            time.sleep(0.05)

    def sigterm_while_riding_out(self, proc, log_path, deadline, then=None):
        """Kills the test's one shard, calls then(), waits until `proc`
        rides out the shard's loss, sends it SIGTERM and waits for its
        exit; its log."""
        self.servers[0].kill()
        self.servers[0].wait(timeout=30)
        if then is not None:
            then()
        self.wait_while_running(
            proc, log_path,
            lambda: "lost a parameter server" in open(log_path).read(),
            deadline)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        return open(log_path).read()

    def write_config(self, base, model=None, name="run.config"):
        import monsoon.torch as mt
        base_path = os.path.join(self.dir, name + ".base")
        with open(base_path, "w") as f:
            f.write(base)
        path = os.path.join(self.dir, name)
        mt.export_layout(model or model_for_test(), path, base_path)
        return path

    def start_shards(self, config, shards=2, workers=2):
        addresses = []
        for s in range(shards):
            port_file = os.path.join(self.dir, "port%d" % s)
            if os.path.exists(port_file):  # a shard of an earlier run's
                os.remove(port_file)
            self.servers.append(subprocess.Popen(
                [PS_SERVER, "--shard=%d" % s, "--num_shards=%d" % shards,
                 "--num_workers=%d" % workers, "--config=" + config,
                 "--listen=127.0.0.1:0", "--port_file=" + port_file,
                 "--log_every_s=0"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.time() + 60
            while not (os.path.exists(port_file) and open(port_file).read().strip()):
                self.assertLess(time.time(), deadline, "shard %d did not start" % s)
                self.assertIsNone(self.servers[-1].poll(), "shard %d exited" % s)
                time.sleep(0.05)
            addresses.append("127.0.0.1:" + open(port_file).read().strip())
        return ",".join(addresses)

    def run_workers(self, config, servers, workers=2, steps=40, extra=False,
                    expect_ok=True, local_lr=0.05, variant="plain",
                    model="narrow"):
        procs = []
        for r in range(workers):
            env = self.script_env(
                servers, config, r, workers, MONSOON_REPORT_OUT=os.path.join(
                    self.dir, "worker-%d.report" % r))
            procs.append(subprocess.Popen(
                [sys.executable, self.script, str(steps),
                 "extra" if extra else "plain", str(local_lr), variant,
                 model],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        results = []
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=240)
            if not expect_ok:
                results.append((p.returncode, err))
                continue
            self.assertEqual(p.returncode, 0, "worker %d failed:\n%s" % (r, err))
            line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
            results.append(dict(json.loads(line[len("RESULT "):]), stderr=err))
        return results

    def test_sync_matches_pytorch_sgd_on_the_mean_gradient(self):
        config = self.write_config(
            "mode: SYNC learning_rate: 0.1 momentum: 0 batch_size: 8\n")
        results = self.run_workers(config, self.start_shards(config), steps=5)
        self.assertEqual(results[0]["params"], results[1]["params"])
        self.assertEqual([r["steps"] for r in results], [5, 5])
        # The same steps in plain PyTorch: each rank's gradient on the same
        # weights, averaged, then w -= 0.1 * mean.
        self.assertParamsClose(results[0]["params"], plain_sync_steps(5))
        # The shards started from the exported model's weights.
        self.assertEqual(results[0]["start"],
                         [p.detach().reshape(-1).tolist()
                          for p in model_for_test().parameters()])

    def test_sync_applies_the_wrapped_optimizers_weight_decay_and_schedule(self):
        # The wrapped SGD's weight decay (0.01) and a StepLR on the
        # DistributedOptimizer (the rate halved every 2 steps) reach the
        # shards' rule through the pushed gradient: the same steps as plain
        # PyTorch's SGD with both, on the mean gradient. The wrapped rate
        # (0.1) is the run's, so rank 0 has nothing to say about the rule.
        config = self.write_config(
            "mode: SYNC learning_rate: 0.1 momentum: 0 batch_size: 8\n")
        results = self.run_workers(config, self.start_shards(config), steps=5,
                                   local_lr=0.1, variant="decay")
        self.assertEqual(results[0]["params"], results[1]["params"])
        self.assertParamsClose(
            results[0]["params"],
            plain_sync_steps(5, weight_decay=0.01, halve_every=2))
        for r in results:
            self.assertNotIn("shards apply each step", r["stderr"])

    def test_a_frozen_parameter_takes_no_weight_decay(self):
        # As torch's optimizers skip a parameter without a gradient: the
        # frozen weights end as they started, the rest trained.
        config = self.write_config(
            "mode: SYNC learning_rate: 0.1 momentum: 0 batch_size: 8\n")
        for r in self.run_workers(config, self.start_shards(config), steps=3,
                                  local_lr=0.1, variant="decay_frozen"):
            self.assertEqual(r["params"][0], r["start"][0])
            for trained in range(1, 4):
                self.assertNotEqual(r["params"][trained], r["start"][trained])

    def test_rank_0_says_where_the_wrapped_optimizer_and_the_run_part(self):
        # The wrapped SGD's rate (0.05) is not the run's (0.1); the config's
        # weight decay and schedule are ps_worker's, which a script applies
        # through its optimizer: rank 0 says so, once each; rank 1 nothing.
        config = self.write_config(
            "mode: SYNC learning_rate: 0.1 momentum: 0 batch_size: 8 "
            "weight_decay: 0.001 lr_decay_epochs: 3\n")
        results = self.run_workers(config, self.start_shards(config), steps=2,
                                   local_lr=0.05)
        self.assertEqual(
            results[0]["stderr"].count(
                "monsoon: in sync the shards apply each step with the run's "
                "rule (sgd, learning_rate 0.1, momentum 0); the wrapped SGD "
                "(lr 0.05) takes no step"), 1, results[0]["stderr"])
        self.assertEqual(
            results[0]["stderr"].count(
                "monsoon: the run's config has weight_decay 0.001, which "
                "ps_worker adds to its gradients"), 1, results[0]["stderr"])
        self.assertEqual(
            results[0]["stderr"].count(
                "monsoon: the run's config decays the rates by 0.1 every 3 "
                "epochs"), 1, results[0]["stderr"])
        for said in ("shards apply each step", "weight_decay 0.001",
                     "decays the rates"):
            self.assertNotIn(said, results[1]["stderr"])

    def test_pushes_during_backward_train_bit_for_bit_as_after_it(self):
        # wide_model()'s 70 values on 2 shards: [0, 35) and [35, 70). Once
        # the last layer's gradients (from 10) are final, shard 1's whole
        # range is: all of it but its first value starts on its way (that
        # one goes at step(), when the shards take the push); shard 0 goes
        # at step(). What the script does to its gradients after backward,
        # or a batch other than the one expected, gives the step's parts
        # up and pushes it whole.
        steps = 6
        withdrawn = {"plain": 0, "clip": steps, "twice": steps, "short": 1,
                     "decay": 0, "none": 0}
        for variant, expected in withdrawn.items():
            with self.subTest(variant=variant):
                runs = {}
                for after in (False, True):
                    config = self.write_config(
                        "mode: SYNC learning_rate: 0.1 momentum: 0.9 "
                        "batch_size: 8\n"
                        + ("push_after_backward: true\n" if after else ""),
                        model=wide_model(),
                        name="%s-%s.config" % (variant, after))
                    runs[after] = self.run_workers(
                        config, self.start_shards(config), steps=steps,
                        variant=variant, model="wide")
                    self.tearDown()
                    self.servers = []
                for r in range(2):
                    # A hook on each gradient, where parts can go early.
                    self.assertEqual(runs[False][r]["hooks"], 4)
                    self.assertEqual(runs[True][r]["hooks"], 0)
                    self.assertEqual(runs[True][r]["pushed_during_backward"], 0)
                    self.assertEqual(runs[False][r]["withdrawn"], expected)
                    self.assertEqual(runs[False][r]["pushed_during_backward"],
                                     steps - expected)
                    self.assertEqual(runs[False][r]["params"],
                                     runs[True][r]["params"])
                self.assertNotEqual(runs[False][0]["params"],
                                    runs[False][0]["start"])

    def test_sparse_gradients_train_as_dense_ones(self):
        # nn.Embedding(sparse=True) with zero_grad(set_to_none=True): each
        # step's gradients are tensors of their own, sparse for the table.
        # They are pushed as the dense model's are (the same steps, up to
        # the order of summing repeated ids), rank 0 saying so once.
        runs = {}
        for kind in ("sparse_embedding", "dense_embedding"):
            config = self.write_config(
                "mode: SYNC learning_rate: 0.1 momentum: 0 batch_size: 8\n",
                model=embedding_model(kind == "sparse_embedding"),
                name=kind + ".config")
            runs[kind] = self.run_workers(config, self.start_shards(config),
                                          steps=4, variant="none", model=kind)
            self.tearDown()
            self.servers = []
        sparse, dense = runs["sparse_embedding"], runs["dense_embedding"]
        self.assertEqual(sparse[0]["params"], sparse[1]["params"])
        self.assertParamsClose(sparse[0]["params"], dense[0]["params"])
        self.assertNotEqual(sparse[0]["params"], sparse[0]["start"])
        for r in sparse:  # shard 1's part went during backward every step
            self.assertEqual((r["hooks"], r["withdrawn"],
                              r["pushed_during_backward"]), (3, 0, 4))
        self.assertEqual(sparse[0]["stderr"].count(
            "parameter '0.weight' has sparse gradients"), 1, sparse[0]["stderr"])
        self.assertNotIn("sparse gradients", sparse[1]["stderr"])
        self.assertNotIn("sparse gradients", dense[0]["stderr"])

    def test_a_worker_that_always_changes_its_gradients_stops_overlapping(self):
        # Clipped after every backward pass: 20 steps' parts given up, then
        # the worker pushes after backward, saying so once.
        config = self.write_config(
            "mode: SYNC learning_rate: 0.1 momentum: 0.9 batch_size: 8\n",
            model=wide_model())
        for result in self.run_workers(config, self.start_shards(config),
                                       steps=25, variant="clip",
                                       model="wide"):
            self.assertEqual(result["steps"], 25)
            self.assertEqual(result["withdrawn"], 20)
            self.assertEqual(result["pushed_during_backward"], 0)
            self.assertEqual(
                result["stderr"].count("gave up its pushes during backward "
                                       "20 steps in a row"), 1,
                result["stderr"])

    def test_an_evaluator_stopped_after_its_shards_went_ends_quietly(self):
        # A launcher that ends a failed run stops the shards and sends the
        # evaluator SIGTERM: its last evaluation cannot be made, which it
        # says, and it returns its points and exits 0, without a traceback.
        config = self.write_config("mode: SYNC batch_size: 8\n")
        servers = self.start_shards(config)
        evaluator_script = self.write_script("evaluator.py", EVALUATOR)
        curve = os.path.join(self.dir, "curve.textproto")
        evaluator = subprocess.Popen(
            [sys.executable, evaluator_script],
            env=self.script_env(servers, config, -1, MONSOON_CURVE_OUT=curve),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not (os.path.exists(curve) and "points {" in open(curve).read()):
            self.assertLess(time.time(), deadline, "no evaluation")
            self.assertIsNone(evaluator.poll())
            time.sleep(0.05)
        for server in self.servers:
            server.kill()
            server.wait(timeout=30)
        self.servers = []
        evaluator.send_signal(signal.SIGTERM)
        out, err = evaluator.communicate(timeout=60)
        self.assertEqual(evaluator.returncode, 0, err)
        self.assertNotIn("Traceback", err)
        self.assertIn("stopped by a signal, so no last evaluation", err)
        line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
        self.assertGreaterEqual(len(json.loads(line[len("RESULT "):])["points"]),
                                1)

    def test_evaluator_curve_and_worker_reports(self):
        config = self.write_config(
            "mode: SYNC learning_rate: 0.1 momentum: 0 batch_size: 8\n")
        servers = self.start_shards(config)
        evaluator_script = self.write_script("evaluator.py", EVALUATOR)
        curve = os.path.join(self.dir, "curve.textproto")
        evaluator = subprocess.Popen(
            [sys.executable, evaluator_script],
            env=self.script_env(servers, config, -1, MONSOON_CURVE_OUT=curve),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = self.run_workers(config, servers, steps=20)
        # The evaluator ends by itself once every worker has finished.
        out, err = evaluator.communicate(timeout=120)
        self.assertEqual(evaluator.returncode, 0, err)
        line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
        got = json.loads(line[len("RESULT "):])
        final = got["points"][-1]
        # The final weights are the workers' (sync: both the same), and the
        # point counts every example: 2 workers x 20 steps x 8.
        self.assertEqual(got["params"], results[0]["params"])
        self.assertEqual(final["samples"], 2 * 20 * 8)
        self.assertEqual(final["version"], 20)
        model = model_for_test()
        load_flat(model, [v for t in results[0]["params"] for v in t])
        self.assertAlmostEqual(final["test_loss"], eval_loss(model), delta=1e-6)
        text = open(curve).read()
        self.assertEqual(text.count("points {"), len(got["points"]))
        self.assertIn("run_finished: true", text)
        self.assertIn("samples: 320", text)
        # Each worker wrote the report the launchers read: 20 steps of 8
        # examples, where their time went, done.
        for r in range(2):
            report = open(os.path.join(self.dir, "worker-%d.report" % r)).read()
            self.assertIn("rank: %d\n" % r if r else "steps: 20\n", report)
            self.assertIn("steps: 20\n", report)
            self.assertIn("samples: 160\n", report)
            self.assertIn('outcome: "done"', report)
            self.assertIn('phase: "compute"\n  count: 19\n', report)
            self.assertIn('phase: "push_pull"\n  count: 20\n', report)

    def test_evaluator_recomputes_batch_norm_statistics(self):
        # BatchNorm's running statistics are each worker's own: the
        # evaluator recomputes its own from the pulled weights over the
        # training inputs it is given, and refuses to evaluate without them.
        config = self.write_config(
            "mode: SYNC learning_rate: 0.1 momentum: 0 batch_size: 8\n",
            model=bn_model())
        servers = self.start_shards(config)
        script = self.write_script("evaluator_bn.py", EVALUATOR_BN)
        env = self.script_env(
            servers, config, -1,
            MONSOON_CURVE_OUT=os.path.join(self.dir, "curve.textproto"))
        refused = subprocess.run([sys.executable, script, "none"], env=env,
                                 capture_output=True, text=True, timeout=120)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("the evaluator's model has BatchNorm running statistics "
                      "(module '1')", refused.stderr)
        self.assertIn("bn_batches=", refused.stderr)
        evaluator = subprocess.Popen(
            [sys.executable, script], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        results = self.run_workers(config, servers, steps=10, model="bn")
        out, err = evaluator.communicate(timeout=120)
        self.assertEqual(evaluator.returncode, 0, err)
        line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
        final = json.loads(line[len("RESULT "):])["points"][-1]
        self.assertEqual(final["version"], 10)
        # The final weights with statistics recomputed over the same inputs.
        model = bn_model()
        load_flat(model, [v for t in results[0]["params"] for v in t])
        untrained = eval_loss(model.eval())
        torch.optim.swa_utils.update_bn(bn_batches(), model)
        self.assertAlmostEqual(final["test_loss"], eval_loss(model.eval()),
                               delta=1e-6)
        self.assertNotAlmostEqual(final["test_loss"], untrained, delta=1e-3)

    def test_launch_local_runs_the_script_as_workers_and_evaluator(self):
        script = self.write_script("launched.py", LAUNCHED)
        metrics_path = os.path.join(self.dir, "metrics.json")
        run = self.launch(
            script, "--mode=downpour", "--servers=2", "--workers=2",
            "--epochs=1", "--batch_size=8", "--eval_interval_s=0.5",
            "--metrics_port=0", "--max_restarts=0",
            "--metrics_out=" + metrics_path)
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        self.assertIn("the script's model: 4 tensors, 58 parameters", run.stdout)
        metrics = json.load(open(metrics_path))
        # Every example each worker trained, none skipped or repeated.
        self.assertEqual(metrics["samples"], 2 * 30 * 8)
        self.assertEqual(metrics["samples_skipped"], 0)
        self.assertEqual(metrics["duplicate_pushes"], 0)
        self.assertEqual(metrics["pushes"], 2 * 30)  # shard 0's
        # The script's evaluator measured the curve, whose last point is
        # the trained model's: every example in, well below the exported
        # model's loss.
        curve = metrics["curve"]
        self.assertGreaterEqual(len(curve), 1)
        self.assertEqual(curve[-1]["samples"], 2 * 30 * 8)
        self.assertLess(metrics["final_test_loss"],
                        0.8 * eval_loss(model_for_test()))

    def test_launch_local_lets_a_killed_script_back_in_at_once(self):
        # Restarted after a SIGKILL, the script names the dead process's
        # session: the shard lets it take rank 1 at once, where it used to
        # refuse it until the dead one's lease (30 s for a script) ran out,
        # the sync steps of rank 0 waiting meanwhile.
        script = self.write_script("launched.py", LAUNCHED)
        run = self.launch(
            script, "--mode=sync", "--servers=1", "--workers=2", "--epochs=1",
            "--batch_size=8", "--eval_interval_s=0.5", "--metrics_port=0",
            "--chaos=kill:worker1@0.5s", args="300 0.01")
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        self.assertIn("restarted worker 1", run.stdout)
        self.assertEqual(run.stdout.count("rank 1 registered"), 2,
                         run.stdout[-4000:])
        self.assertEqual(run.stdout.count("refused a registration"), 0,
                         run.stdout[-4000:])

    def test_launch_local_stops_a_run_at_once_when_its_evaluator_fails(self):
        # The workers would step for 1,000 s; the evaluator exits 3 at once,
        # and the launcher ends the run then, saying why, rather than after
        # training without a curve.
        script = self.write_script("launched.py", LAUNCHED)
        run = self.launch(
            script,
            "--evaluator_cmd=%s -c 'raise SystemExit(3)'" % sys.executable,
            "--mode=downpour", "--servers=1", "--workers=2", "--epochs=1",
            "--batch_size=8", "--metrics_port=0", args="100000 0.01",
            timeout=120)
        self.assertEqual(run.returncode, 1, run.stdout[-4000:])
        self.assertIn("eval exited with code 3", run.stdout)
        self.assertIn("the run stops at once, since without its evaluator "
                      "it has no accuracy curve", run.stdout)
        self.assertNotIn("training done", run.stdout)

    def test_launch_local_stops_a_failed_runs_evaluator_without_a_last_point(self):
        # A shard killed and not restarted fails the run: the launcher stops
        # the script's evaluator with SIGINT, which makes no last evaluation
        # (its shards are gone), and the workers before the servers.
        script = self.write_script("launched.py", LAUNCHED)
        run = self.launch(
            script, "--mode=downpour", "--servers=2", "--workers=2",
            "--epochs=1", "--batch_size=8", "--eval_interval_s=0.2",
            "--metrics_port=0", "--max_restarts=0", "--chaos=kill:server1@1s",
            args="100000 0.01", timeout=120)
        self.assertEqual(run.returncode, 1, run.stdout[-4000:])
        self.assertIn("server 1 exited with code 137", run.stdout)
        self.assertIn("[eval] monsoon: SIGINT: the evaluator stops without a "
                      "last evaluation", run.stdout)
        self.assertNotIn("(final)", run.stdout)
        for r in range(2):
            self.assertIn("[worker %d] monsoon: rank %d stopped by signal 15"
                          % (r, r), run.stdout)

    def test_launch_local_gives_a_script_a_presets_rates_not_its_model(self):
        # --model=lenet brings the preset's weight decay and schedule; its
        # model's own settings (the zero output layer) are not the script's,
        # whose model is its own.
        script = self.write_script("launched.py", LAUNCHED)
        work_dir = os.path.join(self.dir, "run")
        run = self.launch(
            script, "--model=lenet", "--mode=sync", "--servers=1",
            "--workers=2", "--epochs=1", "--batch_size=8",
            "--eval_interval_s=0.5", "--metrics_port=0", "--max_restarts=0")
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        self.assertIn("the script's model: 4 tensors, 58 parameters", run.stdout)
        config = open(os.path.join(work_dir, "config.textproto")).read()
        self.assertIn("weight_decay: 0.0005\n", config)
        self.assertIn("lr_decay_epochs: 10\n", config)
        self.assertNotIn("output_init", config)
        self.assertNotIn("layers", config)

    def test_launch_local_says_when_the_script_writes_no_layout(self):
        script = self.write_script("nolayout.py", "import monsoon.torch as mt\nmt.init()\n")
        run = self.launch(script, "--metrics_port=0", timeout=120)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("--worker_cmd exited without writing its model's layout",
                      run.stdout)
        self.assertIn("DistributedOptimizer", run.stdout)

    def test_the_launchers_refuse_allreduce_for_a_script_before_it_runs(self):
        # The script would refuse it at its first call, after the servers
        # started: the launchers say so first, and never run it.
        ran = os.path.join(self.dir, "ran")
        script = self.write_script("marks.py", "open(%r, 'w').close()\n" % ran)
        command = "--worker_cmd=%s %s" % (sys.executable, script)
        launch = self.launch(script, "--mode=allreduce", "--metrics_port=0",
                             timeout=120)
        self.assertNotEqual(launch.returncode, 0)
        self.assertIn("--worker_cmd: mode allreduce is not open to scripts",
                      launch.stdout)
        compare = subprocess.run(
            [COMPARE_MODES, command, "--modes=sync,allreduce",
             "--out_dir=" + os.path.join(self.dir, "cmp")],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=120)
        self.assertEqual(compare.returncode, 2, compare.stdout[-2000:])
        self.assertIn("--worker_cmd: mode allreduce is not open to scripts",
                      compare.stdout)
        self.assertIn("leave allreduce out of --modes", compare.stdout)
        self.assertFalse(os.path.exists(ran))

    def run_elastic(self, mode, pause, chaos=None, epochs=2, die_after=None,
                    workers=2, loader=False):
        """launch_local --elastic with ELASTIC as the workers (2 at the
        start): the batches each rank stepped, and metrics.json."""
        script = self.write_script("elastic.py", ELASTIC)
        log = os.path.join(self.dir, "batches")
        metrics_path = os.path.join(self.dir, "metrics.json")
        command = [
            LAUNCH_LOCAL,
            "--worker_cmd=%s %s %s %s%s" % (
                sys.executable, script, pause, log,
                "" if die_after is None else " %s %d" % (die_after, workers)),
            "--elastic", "--mode=" + mode, "--servers=2",
            "--workers=%d" % workers,
            "--epochs=%d" % epochs, "--batch_size=8", "--eval_interval_s=0.5",
            "--metrics_port=0", "--metrics_out=" + metrics_path,
            "--work_dir=" + os.path.join(self.dir, "run")]
        if chaos:
            command.append("--chaos=" + chaos)
        env = dict(self.env)
        if loader:
            env["ELASTIC_TEST_LOADER"] = "1"
        run = subprocess.run(command, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        stepped = {}
        for rank in range(4):
            path = "%s-%d" % (log, rank)
            if os.path.exists(path):
                with open(path) as f:
                    stepped[rank] = [json.loads(l) for l in f]
        with open(metrics_path) as f:
            return stepped, json.load(f), run.stdout

    def assertEveryExampleOfEveryEpoch(self, stepped, epochs, once):
        # 240 examples in batches of 8: 30 batches an epoch, each some
        # permutation's run of 8; every epoch's batches together hold every
        # example (once each when no worker left), in an order of its own.
        seen = {}
        for batches in stepped.values():
            for step in batches:
                epoch, batch, indices = (step["epoch"], step["batch"],
                                         step["indices"])
                self.assertEqual(step["per_epoch"], 30)
                self.assertEqual(len(indices), 8)
                seen.setdefault(epoch, {}).setdefault(batch, []).append(
                    indices)
        self.assertEqual(sorted(seen), list(range(epochs)))
        orders = []
        for epoch in range(epochs):
            self.assertEqual(sorted(seen[epoch]), list(range(30)))
            copies = [len(c) for c in seen[epoch].values()]
            if once:
                self.assertEqual(copies, [1] * 30)
            order = []
            for batch in range(30):
                # A batch trained twice holds the same examples each time.
                for again in seen[epoch][batch][1:]:
                    self.assertEqual(again, seen[epoch][batch][0])
                order += seen[epoch][batch][0]
            self.assertEqual(sorted(order), list(range(240)))
            orders.append(order)
        if epochs > 1:
            self.assertNotEqual(orders[0], orders[1])
        self.assertNotEqual(orders[0], list(range(240)))

    def test_elastic_scripts_train_every_example_of_every_epoch_once(self):
        stepped, metrics, _ = self.run_elastic("downpour", 0)
        self.assertEqual(sorted(stepped), [0, 1])
        self.assertEveryExampleOfEveryEpoch(stepped, 2, once=True)
        self.assertEqual(metrics["examples_trained"], [240, 240])
        self.assertEqual(metrics["examples_trained_twice"], 0)
        self.assertEqual(metrics["samples"], 480)
        self.assertLess(metrics["final_test_loss"],
                        0.8 * eval_loss(model_for_test()))

    def test_elastic_scripts_may_take_batches_ahead_through_a_dataloader(self):
        # A DataLoader with worker processes over mt.Batches takes batches
        # (and data shards) ahead of training: downpour trains every example
        # of every epoch once all the same.
        stepped, metrics, _ = self.run_elastic("downpour", 0, loader=True)
        self.assertEveryExampleOfEveryEpoch(stepped, 2, once=True)
        self.assertEqual(metrics["examples_trained"], [240, 240])
        self.assertEqual(metrics["examples_trained_twice"], 0)

    def test_elastic_scripts_join_and_leave_in_sync(self):
        # Worker 2 joins, worker 1 leaves (SIGTERM) while the others train:
        # nobody restarts, every data shard of every epoch is done, and
        # what worker 1 held is trained by the others.
        stepped, metrics, out = self.run_elastic(
            "sync", 0.05, "add:worker@0.2s,remove:worker1@2.5s", epochs=8)
        self.assertIn("worker 1 left", out)
        self.assertEqual(metrics["restarts"], 0)
        self.assertEqual(sorted(stepped), [0, 1, 2])
        self.assertGreater(len(stepped[2]), 0, out[-4000:])
        self.assertEveryExampleOfEveryEpoch(stepped, 8, once=False)
        self.assertEqual(metrics["examples_trained"], [240] * 8)
        self.assertGreater(metrics["add_to_first_push_s"], 0)
        self.assertGreater(metrics["join_to_first_push_s"], 0)
        self.assertLess(metrics["join_to_first_push_s"],
                        metrics["add_to_first_push_s"])

    def test_an_elastic_scripts_death_hands_its_data_back_at_once(self):
        # The launcher ends the killed script's session on the shards: its
        # data shard goes back to the queue now, not after its lease (30 s
        # for a script, and one and a half of it for the queue), which the
        # others would wait out once the rest is trained.
        stepped, metrics, out = self.run_elastic(
            "easgd", 0.05, "kill:worker1@0.5s", epochs=4)
        self.assertIn("worker 1 died (exit code 137)", out)
        self.assertIn("launch: ended worker 1's session on every shard", out)
        self.assertIn("shard 0: rank 1's unfinished data shard went back to "
                      "the queue", out)
        self.assertEveryExampleOfEveryEpoch(stepped, 4, once=False)
        self.assertEqual(metrics["examples_trained"], [240] * 4)
        # The shard it held, and (easgd) one it trained whose last steps
        # had not reached the centre.
        self.assertGreaterEqual(metrics["data_shards_requeued"], 1)
        self.assertNotIn("waiting 5 s so far", out)
        self.assertLess(metrics["max_step_gap_s"], 30)

    def test_a_sync_script_that_waited_out_of_the_steps_joins_again(self):
        # Three workers, one data shard each, then the last shard (batches
        # 24 to 29) to the first to ask: it steps 24 and 25 alone (the
        # others find nothing left, step out of the run and wait), holds the
        # shard 1 s and dies. The shard comes back, a waiting worker joins
        # the run again, pulls the current weights and trains it.
        stepped, metrics, out = self.run_elastic(
            "sync", 0, epochs=1, die_after=1.0, workers=3)
        with open(os.path.join(self.dir, "batches-died")) as f:
            died = int(f.read())
        self.assertIn("worker %d died (exit code 137)" % died, out)
        self.assertIn("out of the steps until one comes back", out)
        self.assertIn("a data shard came back; joined the run again", out)
        self.assertEveryExampleOfEveryEpoch(stepped, 1, once=False)
        self.assertEqual(metrics["examples_trained"], [240])
        # The dead worker stepped batches 24 and 25 alone while the others
        # waited; the one that took the shard over started from the weights
        # those steps made, not from its own of before them.
        last = stepped[died][-1]
        self.assertEqual(last["batch"], 25)
        again = [s for r, steps in stepped.items() if r != died
                 for s in steps if s["batch"] == 24]
        summary = {r: [(s["epoch"], s["batch"]) for s in steps]
                   for r, steps in stepped.items()}
        self.assertEqual(len(again), 1, (died, summary, out[-3000:]))
        self.assertEqual(again[0]["before"], last["after"])
        self.assertLess(metrics["final_test_loss"],
                        0.8 * eval_loss(model_for_test()))

    def test_a_script_that_joins_after_the_data_is_trained_exits_0(self):
        # Rank 0 trains the elastic run's every batch; rank 1, started
        # after that (a launcher's add as the run ends), has nothing to
        # train: it says so, writes a report of no steps and exits 0, as
        # ps_worker does, where it used to fail on OUT_OF_RANGE.
        script = self.write_script("elastic.py", ELASTIC)
        config = self.write_config(
            "mode: DOWNPOUR batch_size: 8 epochs: 2 elastic: true\n")
        servers = self.start_shards(config, shards=1, workers=2)
        runs = []
        for rank in (0, 1):
            report = os.path.join(self.dir, "worker-%d.report" % rank)
            env = self.script_env(servers, config, rank, 2,
                                  MONSOON_REPORT_OUT=report)
            runs.append(subprocess.run(
                [sys.executable, script, "0", os.path.join(self.dir, "b")],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, timeout=120))
            self.assertEqual(runs[-1].returncode, 0, runs[-1].stderr)
        with open(os.path.join(self.dir, "b-0")) as f:
            self.assertEqual(len(f.readlines()), 2 * 30)
        self.assertIn("monsoon: rank 1 has nothing left to train: "
                      "OUT_OF_RANGE", runs[1].stderr)
        late = open(os.path.join(self.dir, "worker-1.report")).read()
        self.assertIn('outcome: "done: nothing left to train"', late)
        self.assertNotIn("steps:", late)

    def test_batches_of_a_fixed_run_are_the_ranks_part_and_resume(self):
        self.check_fixed_batches(loader=False)

    def test_batches_of_a_fixed_run_through_a_dataloader(self):
        self.check_fixed_batches(loader=True)

    def check_fixed_batches(self, loader):
        # Two ranks of a fixed run take their batches from mt.Batches: each
        # its half of the set, every example of it once an epoch, in an
        # order of its own each epoch. Rank 0 leaves after 3 steps without
        # finishing (as one that died); started again, it resumes at its
        # fourth batch.
        script = self.write_script("batches.py", FIXED_BATCHES)
        config = self.write_config(
            "mode: DOWNPOUR batch_size: 8 epochs: 2\n")
        servers = self.start_shards(config, shards=1, workers=2)
        log = os.path.join(self.dir, "b")

        def run(rank, stop_after):
            env = self.script_env(servers, config, rank, 2)
            return subprocess.Popen(
                [sys.executable, script, log, str(stop_after)] +
                (["loader"] if loader else []), env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        first = [run(0, 3), run(1, 0)]
        for p in first:
            _, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, err)
        again = run(0, 0)
        _, err = again.communicate(timeout=120)
        self.assertEqual(again.returncode, 0, err)
        with open(log + "-0") as f:
            rank0 = [json.loads(l)[0] for l in f]
        with open(log + "-1") as f:
            rank1 = [json.loads(l)[0] for l in f]
        # 15 batches an epoch each, rank 0's in two runs.
        self.assertEqual(len(rank0), 30)
        self.assertEqual(len(rank1), 30)
        for rank, steps, part in ((0, rank0, range(0, 120)),
                                  (1, rank1, range(120, 240))):
            orders = [[i for batch in steps[e * 15:(e + 1) * 15]
                       for i in batch] for e in (0, 1)]
            for order in orders:
                self.assertEqual(sorted(order), list(part), rank)
            self.assertNotEqual(orders[0], orders[1])
            self.assertNotEqual(orders[0], list(part))

    def test_elastic_runs_refuse_steps_out_of_step_with_their_batches(self):
        script = self.write_script("misuse.py", ELASTIC_MISUSE)
        told = {}
        for kind in ("elastic", "fixed"):
            config = self.write_config(
                "mode: %s batch_size: 8 elastic: %s\n"
                % (("SYNC", "true") if kind == "elastic"
                   else ("DOWNPOUR", "false")),
                name=kind + ".config")
            servers = self.start_shards(config, shards=1, workers=1)
            env = self.script_env(servers, config, 0, 1)
            run = subprocess.run([sys.executable, script, kind], env=env,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 timeout=120)
            self.assertEqual(run.returncode, 0, run.stderr)
            line = [l for l in run.stdout.splitlines()
                    if l.startswith("RESULT ")][-1]
            told.update(json.loads(line[len("RESULT "):]))
        self.assertIn("FAILED_PRECONDITION: a step without a batch to train: "
                      "this run is elastic", told["step without a batch"])
        self.assertEqual(told["first batch"], "ok")
        self.assertIn("FAILED_PRECONDITION: the next batch taken before the "
                      "last was trained (0 steps): in an elastic sync run",
                      told["a batch ahead"])
        self.assertIn("INVALID_ARGUMENT: the training set has 256 examples, "
                      "but 240 when this worker took its first batch",
                      told["other size"])
        self.assertIn("INVALID_ARGUMENT: a step of 5 examples: each step "
                      "trains one batch of monsoon.torch.Batches (batch_size "
                      "8)", told["part of a batch"])
        self.assertEqual(told["own step"], "ok")
        self.assertIn("FAILED_PRECONDITION: this worker's next example is "
                      "number 8 of its rank, but its next batch begins at 0",
                      told["batches after own steps"])

    def test_sigterm_ends_a_worker_after_its_step_with_its_report(self):
        config = self.write_config("mode: DOWNPOUR batch_size: 8\n")
        servers = self.start_shards(config)
        script = self.write_script("endless.py", ENDLESS)
        stepped = os.path.join(self.dir, "stepped")
        procs = []
        for r in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, script, stepped],
                env=self.script_env(
                    servers, config, r, 2, MONSOON_REPORT_OUT=os.path.join(
                        self.dir, "worker-%d.report" % r)),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.time() + 120
        while not all(os.path.exists("%s-%d" % (stepped, r)) for r in range(2)):
            self.assertLess(time.time(), deadline, "the workers took no step")
            for p in procs:
                self.assertIsNone(p.poll(), p.stderr.read() if p.poll() else "")
            time.sleep(0.05)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for r, p in enumerate(procs):
            _, err = p.communicate(timeout=60)
            # As ps_worker: 128 + SIGTERM, after the step and a report.
            self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
            self.assertIn("rank %d stopped by signal 15 after" % r, err)
            report = open(os.path.join(self.dir, "worker-%d.report" % r)).read()
            self.assertIn('outcome: "stopped by signal 15"', report)
            steps = int(re.search(r"^steps: (\d+)$", report, re.M).group(1))
            samples = int(re.search(r"^samples: (\d+)$", report, re.M).group(1))
            self.assertGreaterEqual(steps, 1)
            self.assertEqual(samples, 8 * steps)

    def test_sigterm_ends_a_worker_that_waits_for_a_lost_shard(self):
        # Riding out a lost shard, the step waits in C++ for up to
        # shard_lost_timeout_s (300 s), where Python runs no handler:
        # SIGTERM must end the wait, and the script, at once.
        config = self.write_config("mode: DOWNPOUR batch_size: 8\n")
        servers = self.start_shards(config, shards=1, workers=1)
        script = self.write_script("endless.py", ENDLESS)
        stepped = os.path.join(self.dir, "stepped")
        log_path = os.path.join(self.dir, "worker.log")
        report_path = os.path.join(self.dir, "worker-0.report")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, script, stepped],
                env=self.script_env(servers, config, 0, 1,
                                    MONSOON_REPORT_OUT=report_path),
                stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.time() + 120
        self.wait_while_running(
            proc, log_path, lambda: os.path.exists(stepped + "-0"), deadline)
        err = self.sigterm_while_riding_out(proc, log_path, deadline)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("rank 0 stopped by signal 15 after", err)
        self.assertNotIn("Traceback", err)
        report = open(report_path).read()
        self.assertIn('outcome: "stopped by signal 15"', report)
        steps = int(re.search(r"^steps: (\d+)$", report, re.M).group(1))
        samples = int(re.search(r"^samples: (\d+)$", report, re.M).group(1))
        self.assertGreaterEqual(steps, 1)
        # The step given up is not counted.
        self.assertEqual(samples, 8 * steps)

    def test_sigterm_ends_a_finish_that_waits_for_a_lost_shard(self):
        # With n_push 4, two steps leave a summed gradient that mt.finish()
        # pushes; its shard is gone by then, so finish rides out its loss
        # until SIGTERM ends it: the report says so, and the exit is 143.
        config = self.write_config(
            "mode: DOWNPOUR batch_size: 8 n_push: 4\n")
        servers = self.start_shards(config, shards=1, workers=1)
        script = self.write_script("finish_late.py", SCRIPT_MODEL + r'''
import os, time
opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                              named_parameters=model.named_parameters())
mt.broadcast_parameters(model)
for _ in range(2):
    x = torch.randn(8, 4)
    opt.zero_grad()
    F.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
    opt.step(samples=8)
open(sys.argv[1] + "-stepped", "w").close()
while not os.path.exists(sys.argv[1] + "-go"):
    time.sleep(0.02)
mt.finish()
print("FINISH RETURNED", flush=True)
''')
        marks = os.path.join(self.dir, "marks")
        log_path = os.path.join(self.dir, "worker.log")
        report_path = os.path.join(self.dir, "worker-0.report")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, script, marks],
                env=self.script_env(servers, config, 0, 1,
                                    MONSOON_REPORT_OUT=report_path),
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        self.wait_while_running(
            proc, log_path, lambda: os.path.exists(marks + "-stepped"),
            deadline)
        out = self.sigterm_while_riding_out(
            proc, log_path, deadline,
            then=lambda: open(marks + "-go", "w").close())
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM, out)
        self.assertIn("rank 0 stopped by signal 15 after 2 steps", out)
        self.assertNotIn("FINISH RETURNED", out)
        self.assertNotIn("Traceback", out)
        self.assertIn('outcome: "stopped by signal 15"',
                      open(report_path).read())

    def check_learns(self, base, steps=60, local_lr=0.05):
        config = self.write_config(base)
        results = self.run_workers(config, self.start_shards(config), steps=steps,
                                   local_lr=local_lr)
        model = model_for_test()
        before = eval_loss(model)
        for r in results:
            self.assertEqual(r["steps"], steps)
            load_flat(model, [v for t in r["params"] for v in t])
            after = eval_loss(model)
            self.assertLess(after, 0.8 * before, (before, after))

    def test_downpour_learns(self):
        self.check_learns("mode: DOWNPOUR batch_size: 8 learning_rate: 0.1\n")

    def test_downpour_with_local_steps_learns(self):
        self.check_learns(
            "mode: DOWNPOUR batch_size: 8 learning_rate: 0.1 n_push: 3 n_fetch: 2\n")

    def test_onebit_learns(self):
        self.check_learns("mode: ONEBIT batch_size: 8 learning_rate: 0.1\n")

    def test_hogwild_learns(self):
        self.check_learns("mode: HOGWILD batch_size: 8 learning_rate: 0.1\n")

    def test_easgd_learns(self):
        # The script's own SGD takes the local steps.
        self.check_learns("mode: EASGD batch_size: 8 tau: 4\n", local_lr=0.2)

    def test_a_script_that_ends_without_finish_finishes_at_exit(self):
        # Its report says done; a script that ends on an uncaught exception
        # leaves none (it did not finish) and exits 1.
        config = self.write_config(
            "mode: DOWNPOUR learning_rate: 0.1 batch_size: 8\n")
        for r in self.run_workers(config, self.start_shards(config), steps=5,
                                  variant="no_finish"):
            self.assertEqual(r["steps"], 5)
        for rank in range(2):
            report = open(os.path.join(self.dir,
                                       "worker-%d.report" % rank)).read()
            self.assertIn('outcome: "done"', report)
            self.assertIn("steps: 5\n", report)
            os.remove(os.path.join(self.dir, "worker-%d.report" % rank))
        self.tearDown()
        self.servers = []
        for code, err in self.run_workers(config, self.start_shards(config),
                                          steps=5, variant="crash",
                                          expect_ok=False):
            self.assertEqual(code, 1, err)
            self.assertIn("RuntimeError: the script failed after its steps",
                          err)
        for rank in range(2):
            self.assertFalse(os.path.exists(
                os.path.join(self.dir, "worker-%d.report" % rank)))

    def test_a_script_started_again_learns_where_its_data_resumes(self):
        # Rank 0 leaves after 3 steps of 8 examples without finishing (as
        # one that died would); started again, it resumes at example 24.
        config = self.write_config(
            "mode: DOWNPOUR learning_rate: 0.1 batch_size: 8\n")
        servers = self.start_shards(config, workers=1)
        first = self.run_workers(config, servers, workers=1, steps=3,
                                 variant="leave")[0]
        self.assertEqual(first["resume_point"], 0)
        again = self.run_workers(config, servers, workers=1, steps=2)[0]
        self.assertEqual(again["resume_point"], 24)

    def test_parameter_without_gradient_pushes_zeros(self):
        model = model_for_test()
        model.register_parameter("unused", torch.nn.Parameter(torch.ones(3)))
        config = self.write_config(
            "mode: SYNC learning_rate: 0.1 momentum: 0 batch_size: 8\n", model)
        results = self.run_workers(config, self.start_shards(config), steps=3,
                                   extra=True)
        # Zero gradients leave it at 1.
        unused = results[0]["names"].index("unused")
        self.assertEqual(results[0]["params"][unused], [1.0, 1.0, 1.0])
        self.assertEqual(results[0]["params"], results[1]["params"])

    def test_differing_model_is_refused_naming_the_difference(self):
        import monsoon.torch as mt
        other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                    torch.nn.Linear(8, 3))
        config = self.write_config("mode: SYNC\n", other)
        results = self.run_workers(config, "127.0.0.1:1", steps=1,
                                   expect_ok=False)
        for code, err in results:
            self.assertNotEqual(code, 0)
            self.assertIn("parameter 2 ('2.weight') has shape [2, 8] here but "
                          "[3, 8] in the run's model", err)
        run = [("0.weight", [8, 4]), ("0.bias", [8])]
        self.assertIn("parameter 0 is '0.bias' here but '0.weight'",
                      mt.first_difference(list(reversed(run)), run))
        self.assertIn("this model has 3 parameters, the run's 2: 'x' is here",
                      mt.first_difference(run + [("x", [1])], run))
        self.assertIsNone(mt.first_difference(run, run))

    def test_calls_before_init_and_bad_tensors_are_refused(self):
        code = (
            "import torch, monsoon.torch as mt\n"
            "m = torch.nn.Linear(2, 2)\n"
            "try:\n"
            "    mt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1),"
            " named_parameters=m.named_parameters())\n"
            "except RuntimeError as e: print('E1', e)\n"
            "mt.init()\n"
            "m = m.double()\n"
            "try:\n"
            "    mt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1),"
            " named_parameters=m.named_parameters())\n"
            "except TypeError as e: print('E2', e)\n"
            "m = m.float()\n"
            "try:\n"
            "    mt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1),"
            " named_parameters=m.named_parameters())\n"
            "except ValueError as e: print('E3', e)\n"
            "open('mlp.config', 'w').write('layer_sizes: [2, 2]')\n"
            "mt.init(config='mlp.config')\n"
            "try:\n"
            "    mt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1),"
            " named_parameters=m.named_parameters())\n"
            "except ValueError as e: print('E4', e)\n")
        env = {k: v for k, v in self.env.items() if k != "MONSOON_CONFIG"}
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=self.dir,
                             capture_output=True, text=True, timeout=120)
        self.assertIn("E1 monsoon.torch.DistributedOptimizer before "
                      "monsoon.torch.init()", out.stdout, out.stderr)
        self.assertIn("E2 parameter weight is torch.float64; monsoon trains "
                      "float32 parameters", out.stdout, out.stderr)
        self.assertIn("E3 no run config: set MONSOON_CONFIG", out.stdout,
                      out.stderr)
        self.assertIn("E4 the run's config (mlp.config) describes one of "
                      "Monsoon's own models", out.stdout, out.stderr)

    def test_init_keeps_large_freed_blocks_for_the_next_step(self):
        # After init() the process is a worker: a 24 MiB tensor comes from
        # malloc's heap, not a mapping of its own that every step would
        # fault in afresh (common/process_tuning.h). No block that large was
        # freed before, so glibc's own threshold would still map it.
        code = (
            "import ctypes, torch, monsoon.torch as mt\n"
            "class Info(ctypes.Structure):\n"
            "    _fields_ = [(f, ctypes.c_size_t) for f in ('arena', "
            "'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', "
            "'uordblks', 'fordblks', 'keepcost')]\n"
            "libc = ctypes.CDLL('libc.so.6')\n"
            "libc.mallinfo2.restype = Info\n"
            "mt.init()\n"
            "before = libc.mallinfo2().hblks\n"
            "t = torch.ones(6 << 20)\n"
            "print('MAPPED', libc.mallinfo2().hblks - before)\n")
        env = {k: v for k, v in self.env.items()
               if not k.startswith("MALLOC_")}
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=self.dir,
                             capture_output=True, text=True, timeout=120)
        self.assertIn("MAPPED 0\n", out.stdout, out.stderr)

    def test_run_config_gives_the_local_steps_rate_and_momentum(self):
        # What a script's wrapped optimizer takes to step locally as ps_worker
        # does: the resolved local rate and momentum (easgd's defaults 0.01
        # and 0.9; another mode's 0.05 and 0; a given value as given).
        code = (
            "import sys, monsoon.torch as mt\n"
            "mt.init(config=sys.argv[1])\n"
            "c = mt.run_config()\n"
            "print('RC', c['mode'], ' '.join('%g' % round(c[k], 6) for k in "
            "('local_learning_rate', 'local_momentum', 'learning_rate')))\n")
        cases = [("mode: EASGD\n", "RC easgd 0.01 0.9 "),
                 ("mode: DOWNPOUR\n", "RC downpour 0.05 0 "),
                 ("mode: EASGD local_learning_rate: 0.03 local_momentum: 0.5 "
                  "learning_rate: 0.2\n", "RC easgd 0.03 0.5 0.2")]
        for i, (base, expected) in enumerate(cases):
            config = self.write_config(base, name="rc%d.config" % i)
            out = subprocess.run([sys.executable, "-c", code, config],
                                 env=self.env, cwd=self.dir,
                                 capture_output=True, text=True, timeout=120)
            self.assertIn(expected, out.stdout, out.stderr)

    def test_sparse_rows_are_pulled_and_pushed_by_id(self):
        # Rows of a table of dim 2 start at 0 (init_scale 0); SGD at the
        # run's rate 0.5: id 5 pushed twice in one call sums its gradients.
        config = self.write_config(
            "mode: DOWNPOUR learning_rate: 0.5 batch_size: 8 "
            "sparse_tables { name: 'emb' dim: 2 optimizer: SPARSE_SGD "
            "init_scale: 0 max_rows: 100 }\n")
        servers = self.start_shards(config, shards=2, workers=1)
        code = (
            "import json, torch, monsoon.torch as mt\n"
            "mt.init()\n"
            "m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),"
            " torch.nn.Linear(8, 2))\n"
            "try:\n"
            "    mt.sparse_pull('emb', torch.tensor([1]))\n"
            "except RuntimeError as e: print('E0', e)\n"
            "opt = mt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1),"
            " named_parameters=m.named_parameters())\n"
            "ids = torch.tensor([[5, 9], [5, 123456789]])\n"
            "g = torch.tensor([[[1., 2.], [3., 4.]], [[10., 20.], [-2., 0.]]])\n"
            "done = mt.sparse_push('emb', ids, g)\n"
            "rows = mt.sparse_pull('emb', torch.tensor([123456789, 5, 9, 7]))\n"
            "try:\n"
            "    mt.sparse_push('emb', ids, g[0])\n"
            "except ValueError as e: print('E1', e)\n"
            "try:\n"
            "    mt.sparse_pull('ads', ids)\n"
            "except ValueError as e: print('E2', e)\n"
            "mt.finish()\n"
            "print('RESULT ' + json.dumps({'done': done, 'shape': list(rows.shape),"
            " 'rows': rows.tolist()}))\n")
        env = self.script_env(servers, config, 0, 1)
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=self.dir,
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        result = json.loads([l for l in out.stdout.splitlines()
                             if l.startswith("RESULT ")][-1][len("RESULT "):])
        self.assertEqual(result["done"], {"updated": 3, "created": 3,
                                          "not_admitted": 0, "evicted": 0})
        self.assertEqual(result["shape"], [4, 2])
        self.assertEqual(result["rows"], [[1.0, 0.0], [-5.5, -11.0],
                                          [-1.5, -2.0], [0.0, 0.0]])
        self.assertIn("E0 monsoon.torch.sparse_pull before "
                      "monsoon.torch.DistributedOptimizer", out.stdout)
        self.assertIn("E1 sparse_push: grads of shape (2, 2) for ids of shape "
                      "(2, 2) and table 'emb' of dim 2", out.stdout)
        self.assertIn("E2 no sparse table 'ads' in the run's config (its "
                      "tables: emb)", out.stdout)


if __name__ == "__main__":
    unittest.main()
