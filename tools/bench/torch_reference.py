#!/usr/bin/python3
"""PyTorch reference for Monsoon's end-to-end training throughput.

Trains the same model (--model: the MLP, or LeNet as Monsoon's `lenet`
preset builds it; softmax cross-entropy, float32) on the same Fashion-MNIST
data, batch size, epoch count and CPU threads as a Monsoon run, in one of
three ways, and reports training samples per second and the final test
accuracy:

  single  one process, SGD with momentum 0.9 on the whole training set.
  ddp     --workers processes, DistributedDataParallel over gloo on
          127.0.0.1, SGD with momentum 0.9; worker r trains on the r-th
          contiguous 1/W of the training set.
  rpc_ps  a parameter server over torch.distributed.rpc: one server process
          holds the weights, --workers trainer processes each do
          forward/backward on a local copy and then one rpc_sync that sends
          the gradients and returns the weights after the server's plain SGD
          update (w -= lr * g, under a lock).
  monsoon this process is one worker of a Monsoon run, through the monsoon
          package (monsoon.torch), started by train_bench --worker=torch
          or `launch_local --worker_cmd='python3 torch_reference.py
          --mode=monsoon --model=...'`: the same model and loop as ddp, the
          run's mode, batch, epochs and rules from the run's config (the
          shards' rule in sync; the local rate and momentum of the config
          where the mode steps locally); worker r trains the r-th contiguous
          1/W. As the evaluator (rank -1) it evaluates when the launcher
          asks. The launcher reports the figures, from the workers' reports.

Only training steps are timed: from just before the first step to just after
the last one, over all workers (total samples / (latest end - earliest
start)). Process start-up, data loading and test evaluation are not counted.

    torch_reference.py --mode=ddp --workers=2 --epochs=3 --json

prints one line of JSON with the figures (see --help). Exit status: 0 on
success, 1 if training failed, 2 on bad flags or missing data, 3 if PyTorch
(or numpy) is not installed.
"""

import argparse
import ctypes
import datetime
import gzip
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback

# numpy and PyTorch, imported by _import_deps() once the thread-count
# environment variables are set: both load OpenBLAS, which reads
# OPENBLAS_NUM_THREADS only when it is loaded.
np = None
torch = None

_THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "MKL_NUM_THREADS")

_IMAGES_MAGIC = 0x00000803
_LABELS_MAGIC = 0x00000801

_DATA_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

_PS_NAME = "ps"

# Exit statuses.
_EXIT_FAILED = 1
_EXIT_USAGE = 2
_EXIT_NO_TORCH = 3


class UsageError(Exception):
    """Bad flags or missing/invalid data: exit status 2."""


# ---------------------------------------------------------------------------
# Set-up helpers.


def _keep_freed_memory():
    """glibc's malloc keeps large freed blocks, as every Monsoon process does
    (common/process_tuning.h, and monsoon.torch.init() in a script's worker):
    otherwise a step's tensors are mapped and faulted in afresh. DDP on LeNet
    trained at 20,295 samples/s this way against 17,675. A
    MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ in the environment
    wins."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to set
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc.mallopt(m_mmap_threshold, 32 << 20)
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        libc.mallopt(m_trim_threshold, 256 << 20)


def _import_deps(threads):
    """Sets the thread environment, imports numpy and torch, sets threads.

    OpenBLAS (the BLAS of Debian's numpy and python3-torch) reads
    OPENBLAS_NUM_THREADS only when it loads, and torch.set_num_threads() does
    not reach it, so the variables are set to the requested per-process
    thread count (1 by default) before either import. Spawned processes
    inherit them.
    """
    global np, torch
    _keep_freed_memory()
    for var in _THREAD_ENV_VARS:
        os.environ[var] = str(threads)
    # Keeps glog's INFO lines ("RPC agent ... is shutting down") off stderr.
    os.environ.setdefault("GLOG_minloglevel", "1")
    if torch is None:
        try:
            # pylint: disable-next=import-outside-toplevel
            import torch as torch_module
        except ImportError:
            print("torch_reference: PyTorch is not installed "
                  "(Debian: apt-get install python3-torch)", file=sys.stderr)
            sys.exit(_EXIT_NO_TORCH)
        torch = torch_module
    if np is None:
        try:
            # pylint: disable-next=import-outside-toplevel
            import numpy as numpy_module
        except ImportError:
            print("torch_reference: numpy is not installed "
                  "(Debian: apt-get install python3-numpy)", file=sys.stderr)
            sys.exit(_EXIT_NO_TORCH)
        np = numpy_module
    torch.set_num_threads(threads)
    return torch


def _free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _epoch_seed(seed, rank, epoch):
    """A well-mixed 63-bit seed from (seed, rank, epoch)."""
    state = np.random.SeedSequence([seed, rank, epoch]).generate_state(
        1, dtype=np.uint64)
    return int(state[0]) & ((1 << 63) - 1)


# ---------------------------------------------------------------------------
# Data.


def _data_path(data_dir, name):
    """The path of `name` or `name`.gz in data_dir; UsageError if neither."""
    for candidate in (name + ".gz", name):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    raise UsageError(f"missing data file {os.path.join(data_dir, name)}[.gz] "
                     f"(set --data_dir to a Fashion-MNIST IDX directory)")


def _open_idx(path):
    """Opens an IDX file for reading bytes, gunzipping if it is gzipped."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def _check_magic(path, raw, magic):
    """Checks the magic number at the start of `raw`; returns the ndim."""
    if len(raw) < 4:
        raise UsageError(f"{path}: too short for an IDX file")
    found = int.from_bytes(raw[0:4], "big")
    if found != magic:
        raise UsageError(f"{path}: magic 0x{found:08x}, expected 0x{magic:08x}")
    return magic & 0xFF


def _idx_dims(path, magic):
    """The dimensions in an IDX file's header."""
    with _open_idx(path) as f:
        ndim = _check_magic(path, f.read(4), magic)
        raw = f.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise UsageError(f"{path}: truncated IDX header")
    return [int.from_bytes(raw[4 * i:4 * i + 4], "big") for i in range(ndim)]


def check_setup(args):
    """Checks the data files and flags against them before any training.

    Reads only the IDX headers (the files are fully checked when loaded), so
    that missing data, a wrong input size or a batch larger than a worker's
    partition fail here with exit status 2 rather than in a child process.
    """
    for name in _DATA_FILES.values():
        _data_path(args.data_dir, name)
    dims = _idx_dims(_data_path(args.data_dir, _DATA_FILES["train_images"]),
                     _IMAGES_MAGIC)
    pixels = dims[1] * dims[2]
    args.image_shape = (dims[1], dims[2])
    if args.model == "mlp" and pixels != args.layer_sizes[0]:
        raise UsageError(f"images have {pixels} pixels but --layer_sizes "
                         f"starts with {args.layer_sizes[0]}")
    _, _, steps = partition(dims[0], 0, args.workers, args.batch_size)
    if steps == 0:
        raise UsageError(f"{dims[0]} training samples over {args.workers} "
                         f"worker(s) give no whole batch of {args.batch_size}")


def read_idx(path, magic):
    """Reads an IDX file (optionally gzipped) into a uint8 numpy array.

    Args:
      path: the file; gzip is detected from its first bytes.
      magic: the expected magic number, 0x00000803 (images) or 0x00000801
        (labels).

    Returns:
      An array of shape (n, rows, cols) for images or (n,) for labels.
    """
    with _open_idx(path) as f:
        raw = f.read()
    ndim = _check_magic(path, raw, magic)
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UsageError(f"{path}: truncated IDX header")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
            for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise UsageError(f"{path}: {len(raw)} bytes, expected {expected} for "
                         f"dimensions {dims}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_split(args, split):
    """Loads 'train' or 't10k' as (float32 images [n, 784], int64 labels).

    Pixels are scaled to [0, 1] and standardized with --input_mean and
    --input_std.
    """
    prefix = "train" if split == "train" else "test"
    images = read_idx(
        _data_path(args.data_dir, _DATA_FILES[prefix + "_images"]),
        _IMAGES_MAGIC)
    labels = read_idx(
        _data_path(args.data_dir, _DATA_FILES[prefix + "_labels"]),
        _LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise UsageError(f"{split}: {images.shape[0]} images but "
                         f"{labels.shape[0]} labels")
    x = images.reshape(images.shape[0], -1).astype(np.float32) / 255.0
    x = (x - np.float32(args.input_mean)) / np.float32(args.input_std)
    if args.model == "mlp" and x.shape[1] != args.layer_sizes[0]:
        raise UsageError(f"{split}: images have {x.shape[1]} pixels but "
                         f"--layer_sizes starts with {args.layer_sizes[0]}")
    return (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
            torch.from_numpy(labels.astype(np.int64)))


def partition(num_samples, rank, world, batch_size):
    """Worker `rank`'s contiguous slice and its number of steps per epoch.

    Every worker gets floor(smallest partition / batch) whole batches, so all
    do the same number of steps.
    """
    lo = num_samples * rank // world
    hi = num_samples * (rank + 1) // world
    steps = (num_samples // world) // batch_size
    return lo, hi, steps


# ---------------------------------------------------------------------------
# Model, training loop and evaluation.


def build_model(args, seed):
    """The --model, torch's default init seeded by `seed`: an MLP with ReLU
    between layers, or LeNet as Monsoon's preset (conv 5x5x6 padding 2,
    ReLU, max pool 2, conv 5x5x16, ReLU, max pool 2, dense 120, ReLU, dense
    84, ReLU, dense to the classes) on the flat images reshaped to 1 x H x W.
    """
    torch.manual_seed(seed)
    if args.model == "lenet":

        class Images(torch.nn.Unflatten):
            """The flat images as 1 x H x W, in channels-last layout: the
            fastest for PyTorch's oneDNN convolutions on a CPU (a step on a
            batch of 64 takes about 3.0 ms against 3.8 ms on one thread),
            so that every reference runs at its best."""

            def forward(self, x):
                return super().forward(x).to(
                    memory_format=torch.channels_last)

        height, width = args.image_shape
        flat = 16 * ((height // 2 - 4) // 2) * ((width // 2 - 4) // 2)
        return torch.nn.Sequential(
            Images(1, (1, height, width)),
            torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(flat, 120), torch.nn.ReLU(),
            torch.nn.Linear(120, 84), torch.nn.ReLU(),
            torch.nn.Linear(84, args.layer_sizes[-1]))
    layer_sizes = args.layer_sizes
    layers = []
    for i in range(len(layer_sizes) - 1):
        if i > 0:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(layer_sizes[i], layer_sizes[i + 1]))
    return torch.nn.Sequential(*layers)


def run_steps(x, y, rank, world, args, step, before_start=None):
    """Runs the timed training loop on worker `rank`'s partition.

    Args:
      x, y: the whole training set.
      rank, world: this worker and the number of workers.
      args: the flags.
      step: step(xb, yb) does one training step.
      before_start: called after all set-up, just before timing starts (for a
        start barrier).

    Returns:
      (start, end, samples): time.time() just before the first step and just
      after the last, and the number of samples trained on.
    """
    lo, hi, steps = partition(x.shape[0], rank, world, args.batch_size)
    if steps == 0:
        raise UsageError(f"worker {rank}: partition of {hi - lo} samples has "
                         f"no whole batch of {args.batch_size}")
    xs, ys = x[lo:hi], y[lo:hi]
    used = steps * args.batch_size
    orders = []
    for epoch in range(args.epochs):
        gen = torch.Generator()
        gen.manual_seed(_epoch_seed(args.seed, rank, epoch))
        orders.append(torch.randperm(hi - lo, generator=gen)[:used])
    if before_start is not None:
        before_start()
    start = time.time()
    for order in orders:
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            step(xs.index_select(0, idx), ys.index_select(0, idx))
    end = time.time()
    return start, end, used * args.epochs


def evaluate(model, test_set):
    """(accuracy, mean cross-entropy loss) of `model` on (x, y) test_set."""
    x, y = test_set
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(dim=1) == y).double().mean().item()
    return accuracy, loss


def _sgd_step_fn(model, optimizer):
    """A step function: forward, backward, optimizer step."""
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(xb, yb):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(xb), yb).backward()
        optimizer.step()

    return step


# ---------------------------------------------------------------------------
# Modes.


def run_single(args):
    """Mode single: one process, SGD with momentum on the whole train set."""
    x, y = load_split(args, "train")
    test_set = load_split(args, "t10k")
    model = build_model(args, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start, end, samples = run_steps(x, y, 0, 1, args,
                                    _sgd_step_fn(model, optimizer))
    accuracy, loss = evaluate(model, test_set)
    return ([{"start": start, "end": end, "samples": samples}],
            {"accuracy": accuracy, "loss": loss})


def run_monsoon(args):
    """Mode monsoon: one Monsoon worker (or the evaluator) of a launcher's
    run, through monsoon.torch; returns the launcher's exit status."""
    try:
        import monsoon.torch as mt  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise UsageError("the monsoon package is not installed (%s): run "
                         "./tools/setup.sh or tools/install_python.sh" % e)
    mt.init()
    model = build_model(args, args.seed)
    if mt.is_evaluator():
        test_set = load_split(args, "t10k")
        mt.evaluate_every(model, lambda m: evaluate(m, test_set))
        return 0
    config = mt.run_config()
    args.batch_size, args.epochs = config["batch_size"], config["epochs"]
    optimizer = mt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=config["local_learning_rate"],
                        momentum=config["local_momentum"]),
        named_parameters=model.named_parameters())
    mt.broadcast_parameters(model)
    x, y = load_split(args, "train")
    start, end, samples = run_steps(x, y, mt.rank(), mt.num_workers(), args,
                                    _sgd_step_fn(model, optimizer))
    mt.finish()
    print(f"torch_reference: monsoon rank {mt.rank()}: {samples} samples in "
          f"{end - start:.2f} s", flush=True)
    return 0


def _ddp_worker(rank, args, port, results):
    """Mode ddp, one process: DistributedDataParallel over gloo."""
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    x, y = load_split(args, "train")
    test_set = load_split(args, "t10k") if rank == 0 else None
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=args.workers,
        timeout=datetime.timedelta(seconds=args.comm_timeout_s))
    try:
        model = build_model(args, args.seed)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        start, end, samples = run_steps(x, y, rank, args.workers, args,
                                        _sgd_step_fn(ddp, optimizer),
                                        before_start=dist.barrier)
        results.put({"kind": "train", "rank": rank, "start": start,
                     "end": end, "samples": samples})
        if rank == 0:
            accuracy, loss = evaluate(model, test_set)
            results.put({"kind": "eval", "accuracy": accuracy, "loss": loss})
    finally:
        dist.destroy_process_group()


class _ParameterServer:
    """The server's weights, and counters for the start and end barriers."""

    def __init__(self, weights, lr, trainers):
        self.weights = weights
        self.lr = lr
        self.trainers = trainers
        self.lock = threading.Lock()
        self.ready = 0
        self.done = 0
        self.all_done = threading.Condition(self.lock)


# The server process's _ParameterServer; the _ps_* functions below run in the
# server's RPC threads.
_PS = None


def _ps_register():
    """Counts a trainer as ready and returns a copy of the weights."""
    with _PS.lock:
        _PS.ready += 1
        return [w.clone() for w in _PS.weights]


def _ps_ready_count():
    with _PS.lock:
        return _PS.ready


def _ps_apply_gradients(grads):
    """Plain SGD (w -= lr * g); returns a copy of the updated weights."""
    with _PS.lock:
        for w, g in zip(_PS.weights, grads):
            w.add_(g, alpha=-_PS.lr)
        return [w.clone() for w in _PS.weights]


def _ps_trainer_done():
    with _PS.lock:
        _PS.done += 1
        _PS.all_done.notify_all()


def _rpc_options(args, port):
    from torch.distributed import rpc  # pylint: disable=import-outside-toplevel
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=args.rpc_worker_threads,
        rpc_timeout=args.comm_timeout_s,
        init_method=f"tcp://127.0.0.1:{port}")


def _rpc_shutdown(rpc, args, failed):
    """Graceful shutdown (waits for all peers) unless this process failed.

    After a failure the shutdown is local, so that the error reaches the
    parent at once instead of after waiting for peers that are still
    training.
    """
    if failed:
        try:
            rpc.shutdown(graceful=False)
        except Exception:  # pylint: disable=broad-except
            pass  # The error being raised is the one to report.
    else:
        rpc.shutdown(graceful=True, timeout=args.comm_timeout_s)


def _ps_server(args, port, results):
    """Mode rpc_ps, rank 0: holds the weights and applies the gradients."""
    global _PS
    from torch.distributed import rpc  # pylint: disable=import-outside-toplevel
    test_set = load_split(args, "t10k")
    model = build_model(args, args.seed)
    _PS = _ParameterServer([p.detach().clone() for p in model.parameters()],
                           args.lr, args.workers)
    rpc.init_rpc(_PS_NAME, rank=0, world_size=args.workers + 1,
                 rpc_backend_options=_rpc_options(args, port))
    try:
        with _PS.lock:
            finished = _PS.all_done.wait_for(
                lambda: _PS.done == _PS.trainers, timeout=args.timeout_s)
        if not finished:
            raise RuntimeError(f"only {_PS.done} of {_PS.trainers} trainers "
                               f"finished within {args.timeout_s:g} s")
    except BaseException:
        _rpc_shutdown(rpc, args, failed=True)
        raise
    _rpc_shutdown(rpc, args, failed=False)
    with torch.no_grad():
        for p, w in zip(model.parameters(), _PS.weights):
            p.copy_(w)
    accuracy, loss = evaluate(model, test_set)
    results.put({"kind": "eval", "accuracy": accuracy, "loss": loss})


def _ps_trainer(rank, args, port, results):
    """Mode rpc_ps, trainer `rank` (RPC rank rank + 1)."""
    from torch.distributed import rpc  # pylint: disable=import-outside-toplevel
    x, y = load_split(args, "train")
    model = build_model(args, args.seed)
    params = list(model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()

    def load(weights):
        with torch.no_grad():
            for p, w in zip(params, weights):
                p.copy_(w)

    def wait_for_all_trainers():
        deadline = time.time() + args.comm_timeout_s
        while rpc.rpc_sync(_PS_NAME, _ps_ready_count) < args.workers:
            if time.time() > deadline:
                raise RuntimeError("not all trainers registered within "
                                   f"{args.comm_timeout_s:g} s")
            time.sleep(0.005)

    def step(xb, yb):
        """Local forward/backward, then one RPC: gradients in, weights out."""
        model.zero_grad(set_to_none=True)
        loss_fn(model(xb), yb).backward()
        load(rpc.rpc_sync(_PS_NAME, _ps_apply_gradients,
                          args=([p.grad for p in params],)))

    rpc.init_rpc(f"trainer{rank}", rank=rank + 1, world_size=args.workers + 1,
                 rpc_backend_options=_rpc_options(args, port))
    try:
        load(rpc.rpc_sync(_PS_NAME, _ps_register))
        start, end, samples = run_steps(x, y, rank, args.workers, args, step,
                                        before_start=wait_for_all_trainers)
        results.put({"kind": "train", "rank": rank, "start": start,
                     "end": end, "samples": samples})
        rpc.rpc_sync(_PS_NAME, _ps_trainer_done)
    except BaseException:
        _rpc_shutdown(rpc, args, failed=True)
        raise
    _rpc_shutdown(rpc, args, failed=False)


def _child_main(role, rank, args, port, results):
    """Entry point of a spawned process: runs `role` and reports failures."""
    _import_deps(args.threads)
    try:
        if role == "ddp":
            _ddp_worker(rank, args, port, results)
        elif role == "ps_server":
            _ps_server(args, port, results)
        elif role == "ps_trainer":
            _ps_trainer(rank, args, port, results)
        else:
            raise ValueError(f"unknown role {role}")
    except BaseException as e:  # pylint: disable=broad-except
        traceback.print_exc()
        results.put({"kind": "error", "name": f"{role}{rank}",
                     "message": f"{type(e).__name__}: {e}"})
        results.close()
        results.join_thread()  # Flush the report before os._exit.
        sys.stderr.flush()
        # Skip interpreter clean-up: a torch.distributed peer may be wedged.
        os._exit(_EXIT_FAILED)  # pylint: disable=protected-access


def _exit_description(p):
    """'exited with status N' or 'was killed by SIGNAME' for a process."""
    if p.exitcode is not None and p.exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-p.exitcode).name}"
        except ValueError:
            return f"was killed by signal {-p.exitcode}"
    return f"exited with status {p.exitcode}"


def _failure(procs, results, first_error=None):
    """A RuntimeError naming every process that failed.

    Waits a moment so that a peer's death, which usually comes first, is seen
    together with the errors it caused in the others.
    """
    errors = [first_error] if first_error else []
    deadline = time.time() + 1.0
    while time.time() < deadline:
        try:
            report = results.get(timeout=0.1)
        except queue.Empty:
            continue
        if report["kind"] == "error":
            errors.append(report)
    problems = [f"{p.name} {_exit_description(p)}" for p in procs
                if p.exitcode is not None and p.exitcode != 0 and
                not any(p.name == e["name"] for e in errors)]
    problems += [f"{e['name']} failed: {e['message']}" for e in errors]
    return RuntimeError("; ".join(problems) if problems else
                        "a process failed")


def run_processes(args, roles):
    """Starts one spawned process per (role, rank) and gathers their reports.

    Fails (RuntimeError) as soon as any process reports an error or exits
    non-zero, or after --timeout_s, and then terminates the others, so no
    process is left waiting on a dead peer.

    Returns:
      (train_reports, eval_report).
    """
    import multiprocessing  # pylint: disable=import-outside-toplevel
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_child_main, name=f"{role}{rank}",
                         args=(role, rank, args, port, results))
             for role, rank in roles]
    train, evals = [], []
    deadline = time.time() + args.timeout_s
    try:
        for p in procs:
            p.start()
        while len(train) < args.workers or not evals:
            try:
                report = results.get(timeout=0.2)
            except queue.Empty:
                report = None
            if report is not None:
                if report["kind"] == "error":
                    raise _failure(procs, results, report)
                (train if report["kind"] == "train" else evals).append(report)
                continue
            if any(p.exitcode is not None and p.exitcode != 0 for p in procs):
                raise _failure(procs, results)
            if all(p.exitcode is not None for p in procs):
                raise RuntimeError("all processes exited without reporting")
            if time.time() > deadline:
                raise RuntimeError(f"no result within --timeout_s="
                                   f"{args.timeout_s:g}")
        for p in procs:
            p.join(timeout=args.comm_timeout_s)
            if p.exitcode is None:
                raise RuntimeError(f"{p.name} did not exit within "
                                   f"{args.comm_timeout_s:g} s of training")
            if p.exitcode != 0:
                raise RuntimeError(f"{p.name} {_exit_description(p)}")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return train, evals[0]


# ---------------------------------------------------------------------------
# Command line.


def _layer_sizes(text):
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a list of integers: {text}") from None
    if len(sizes) < 2 or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(
            "need at least two positive sizes, e.g. 784,256,128,10")
    return sizes


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="PyTorch reference for Monsoon's training throughput: "
        "trains an MLP or LeNet on Fashion-MNIST and reports training samples/s "
        "(training steps only) and final test accuracy.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument(
        "--mode", choices=("single", "ddp", "rpc_ps", "monsoon"),
        default="single",
        help="single: one process, SGD+momentum 0.9 on all data; ddp: "
        "--workers processes with DistributedDataParallel (gloo), "
        "SGD+momentum 0.9; rpc_ps: one torch.distributed.rpc parameter "
        "server (plain SGD) and --workers trainers, one rpc_sync per step; "
        "monsoon: one worker of a Monsoon run (train_bench --worker=torch, "
        "launch_local --worker_cmd), batch, epochs and workers from the run")
    parser.add_argument(
        "--workers", type=int, default=2,
        help="training processes (ddp, rpc_ps); worker r trains on the r-th "
        "contiguous 1/W of the training set; ignored (1) in single mode")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch (and OpenMP/OpenBLAS) threads per process")
    parser.add_argument("--batch_size", type=int, default=64,
                        help="samples per step per worker")
    parser.add_argument("--epochs", type=int, default=3,
                        help="passes over each worker's partition")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="learning rate")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed for initialization and per-epoch shuffles")
    parser.add_argument("--model", choices=("mlp", "lenet"), default="mlp",
                        help="the model: an MLP of --layer_sizes, or LeNet "
                        "(its classes: --layer_sizes' last)")
    parser.add_argument("--layer_sizes", type=_layer_sizes,
                        default="784,256,128,10",
                        metavar="N,N,...",
                        help="MLP layer sizes, input first, classes last")
    parser.add_argument(
        "--data_dir", default="/usr/share/datasets/fashion-mnist",
        help="directory with Fashion-MNIST IDX files (train-images-idx3-ubyte"
        "[.gz], train-labels-idx1-ubyte[.gz], t10k-...)")
    parser.add_argument("--input_mean", type=float, default=0.2860,
                        help="inputs are (pixel/255 - mean) / std")
    parser.add_argument("--input_std", type=float, default=0.3530,
                        help="see --input_mean")
    parser.add_argument(
        "--rpc_worker_threads", type=int, default=8,
        help="rpc_ps: num_worker_threads of the TensorPipe RPC agent")
    parser.add_argument(
        "--comm_timeout_s", type=float, default=120.0,
        help="timeout of process-group/RPC set-up, collectives, RPCs and "
        "RPC shutdown (ddp, rpc_ps)")
    parser.add_argument(
        "--timeout_s", type=float, default=3600.0,
        help="give up (and stop all processes) if the run takes longer")
    parser.add_argument("--json", action="store_true",
                        help="print one line of JSON: mode, model, workers, "
                        "threads, "
                        "batch_size, epochs, samples, train_time_s, "
                        "samples_per_s, test_accuracy, test_loss, "
                        "torch_version")
    args = parser.parse_args(argv)
    for name in ("workers", "threads", "batch_size", "epochs",
                 "rpc_worker_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    for name in ("input_std", "comm_timeout_s", "timeout_s"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name} must be positive")
    if args.mode == "single":
        args.workers = 1
    return args


def main(argv):
    args = parse_args(argv)
    _import_deps(args.threads)
    try:
        check_setup(args)
        if args.mode == "monsoon":
            return run_monsoon(args)
        if args.mode == "single":
            train, evaluation = run_single(args)
        elif args.mode == "ddp":
            train, evaluation = run_processes(
                args, [("ddp", r) for r in range(args.workers)])
        else:
            train, evaluation = run_processes(
                args, [("ps_server", 0)] +
                [("ps_trainer", r) for r in range(args.workers)])
    except UsageError as e:
        print(f"torch_reference: {e}", file=sys.stderr)
        return _EXIT_USAGE
    except (OSError, EOFError) as e:  # Unreadable or corrupt data files.
        print(f"torch_reference: cannot read data: {e}", file=sys.stderr)
        return _EXIT_USAGE
    except RuntimeError as e:
        print(f"torch_reference: {args.mode}: {e}", file=sys.stderr)
        return _EXIT_FAILED

    samples = sum(r["samples"] for r in train)
    train_time = (max(r["end"] for r in train) -
                  min(r["start"] for r in train))
    result = {
        "mode": args.mode,
        "model": args.model,
        "workers": args.workers,
        "threads": args.threads,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "samples": samples,
        "train_time_s": train_time,
        "samples_per_s": samples / train_time if train_time > 0 else 0.0,
        "test_accuracy": evaluation["accuracy"],
        "test_loss": evaluation["loss"],
        "torch_version": torch.__version__,
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(f"torch_reference: mode={args.mode} workers={args.workers} "
              f"threads={args.threads} batch={args.batch_size} "
              f"epochs={args.epochs}: {samples} samples in {train_time:.2f} s "
              f"= {result['samples_per_s']:.0f} samples/s; test accuracy "
              f"{result['test_accuracy']:.4f}, loss {result['test_loss']:.4f} "
              f"(torch {torch.__version__})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
