"""monsoon.torch: a PyTorch training script as a Monsoon worker.

    import monsoon.torch as mt
    mt.init()                      # MONSOON_* environment, or keywords
    model = MyNet()
    opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters())
    mt.broadcast_parameters(model)  # start from the shards' weights
    for x, y in loader:
        opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
    mt.finish()                    # leaves as finished, so the run can end

What opt.step() does is the run's mode (the config's `mode`):
  sync      pushes the gradient and waits for the step's weights (the
            barrier); the shards' rule applies it, not the wrapped optimizer.
  downpour, onebit
            with n_push = n_fetch = 1 (the default) the same round trip
            without a barrier; otherwise pushes the gradient summed over
            n_push steps, takes a local step with the wrapped optimizer and
            pulls every n_fetch steps. onebit pushes 1 bit per value with
            its residual.
  hogwild   pushes without waiting for the push, then pulls.
  easgd     local steps with the wrapped optimizer; every tau steps an
            exchange with the centre (x -= alpha (x - centre), pushed).

The model's parameters become views into one flat float32 buffer (and their
gradients into another), which the C++ client reads and writes in place
through the buffer protocol: no copy, and no link against libtorch. Buffers
that are not parameters (BatchNorm's running statistics) stay each worker's
own; the evaluator recomputes them (evaluate_every's bn_batches). CPU
tensors only.

The run's model is its parameters' names, shapes and order: the shards hold
what `export_layout` wrote (the config's `tensors` and the initial weights
of the model that wrote it); a worker whose model differs is refused,
naming the first difference.
"""

import os
import signal
import sys

import numpy
import torch

from monsoon import _monsoon

Error = _monsoon.Error
_SIGTERM = int(signal.SIGTERM)

# Variables that the Python side reads itself (not C++ flags).
_PYTHON_VARIABLES = {"MONSOON_EXPORT_LAYOUT", "MONSOON_PYTHON"}

_state = {}

# Steps in a row whose pushes during backward were given up, after which a
# worker pushes after backward for the rest of the run.
_GIVE_UP_AFTER = 20


def init(**settings):
    """Reads the run's settings: MONSOON_<NAME> environment variables (as the
    launchers set them), then `settings` (servers, rank, num_workers, config,
    tls_ca, tls_cert, tls_key, auth_token_file, connect_timeout_s, ...),
    which win. Connects nothing yet (DistributedOptimizer does)."""
    overrides = [(k, ",".join(v) if isinstance(v, (list, tuple)) else str(v))
                 for k, v in settings.items()]
    unknown = _monsoon.configure(overrides)
    for variable in unknown:
        if variable not in _PYTHON_VARIABLES:
            print("monsoon: warning: %s names no setting; ignored" % variable,
                  file=sys.stderr)
    _state.clear()
    _state["initialized"] = True


def _require_init(what):
    if not _state.get("initialized"):
        raise RuntimeError(
            "monsoon.torch.%s before monsoon.torch.init(): call init() first, "
            "at the top of the script" % what)


def rank():
    _require_init("rank()")
    return int(_monsoon.flag("rank"))


def is_evaluator():
    """Whether this process is the run's evaluator (the launchers start the
    script once more with MONSOON_RANK=-1): it should call evaluate_every
    instead of training."""
    return rank() < 0


def num_workers():
    _require_init("num_workers()")
    return int(_monsoon.flag("num_workers"))


def run_config():
    """The run's resolved config, as far as a script needs it: mode, tensors
    (name and shape of each parameter), batch_size, epochs, seed; the
    shards' rule: optimizer ('sgd' or 'adagrad'), learning_rate, momentum;
    local_learning_rate and local_momentum, the rate and momentum the C++
    worker's local steps use (downpour, onebit, easgd), and weight_decay,
    lr_decay_epochs and lr_decay_factor, which ps_worker applies to its
    gradients: a script's wrapped optimizer takes them to follow the run's
    config; sparse_tables, each sparse table's name and dim; elastic,
    whether workers may join and leave (the data then comes from
    Batches)."""
    _require_init("run_config()")
    return _monsoon.read_config("")


def layout_of(named_parameters):
    """[(name, [dims...]), ...] of a model's named parameters, in order:
    what the run's config holds as `tensors`."""
    return [(name, list(p.shape)) for name, p in named_parameters]


def _check_tensor(name, p):
    if p.dtype != torch.float32:
        raise TypeError(
            "parameter %s is %s; monsoon trains float32 parameters: "
            "call model.float() first" % (name, p.dtype))
    if p.device.type != "cpu":
        raise TypeError(
            "parameter %s is on %s; this build of monsoon moves CPU tensors "
            "only: keep the model on the CPU" % (name, p.device))


def export_layout(model, path, base_config="", weights_path=None):
    """Writes the run's config for `model` to `path`: `base_config` (a
    text-format config file, or every default) with the model's parameters
    as `tensors`, and its current weights to `weights_path` (default
    path + ".weights") as the shards' initial weights. Start the shards
    with --config=path."""
    named = list(model.named_parameters())
    for name, p in named:
        _check_tensor(name, p)
    weights_path = weights_path or path + ".weights"
    flat = torch.cat([p.detach().reshape(-1) for _, p in named])
    flat.numpy().astype("<f4").tofile(weights_path)
    _monsoon.write_layout(base_config, layout_of(named),
                          os.path.abspath(weights_path), path)


def first_difference(mine, run):
    """The first difference between two layouts ([(name, dims)]), as a
    sentence; None when they are the same."""
    for i, ((name, dims), (run_name, run_dims)) in enumerate(zip(mine, run)):
        if name != run_name:
            return ("parameter %d is '%s' here but '%s' in the run's model "
                    "(a different model, or parameters in another order)"
                    % (i, name, run_name))
        if list(dims) != list(run_dims):
            return ("parameter %d ('%s') has shape %s here but %s in the "
                    "run's model" % (i, name, list(dims), list(run_dims)))
    if len(mine) != len(run):
        longer, which = (mine, "here") if len(mine) > len(run) else (run, "in the run's model only")
        return ("this model has %d parameters, the run's %d: '%s' is %s"
                % (len(mine), len(run), longer[min(len(mine), len(run))][0], which))
    return None


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer` (whose local steps downpour, onebit and easgd take)
    so that step() does what the run's mode does. Connects to the shards.
    `named_parameters`: model.named_parameters(), the parameters
    `optimizer` updates, whose names and shapes must be the run's.

    The gradient a worker pushes is the wrapped optimizer's view of it, as
    ps_worker's is its config's: p.grad + weight_decay * p with each param
    group's weight_decay, scaled by the group's lr over its lr when wrapped
    (its `initial_lr` where a scheduler set one), so that a learning-rate
    scheduler on this optimizer (or on the wrapped one) and weight decay
    reach the shards' rule in every mode that pushes gradients. The rule
    itself (SGD with momentum, Adagrad) and its rate are the run's
    config's; local steps (easgd, downpour with n_push > 1) are the wrapped
    optimizer's own."""

    def __init__(self, optimizer, named_parameters):
        # Not torch.optim.Optimizer.__init__: the state is the wrapped
        # optimizer's (param_groups, state, defaults below); the base class
        # makes this one an Optimizer to torch's learning-rate schedulers.
        _require_init("DistributedOptimizer")
        self.optimizer = optimizer
        self._named = list(named_parameters)
        for name, p in self._named:
            _check_tensor(name, p)
        export = os.environ.get("MONSOON_EXPORT_LAYOUT")
        if export:
            # A launcher's first run of the script: write the layout and stop.
            export_layout(_Params(self._named), export, _monsoon.flag("config"))
            print("monsoon: wrote the model's layout to %s" % export)
            sys.exit(0)
        if not _monsoon.flag("config"):
            raise ValueError(
                "no run config: set MONSOON_CONFIG (or init(config=...)) to the "
                "config the shards were started with, written by "
                "monsoon.torch.export_layout")
        config = run_config()
        if not config["tensors"]:
            raise ValueError(
                "the run's config (%s) describes one of Monsoon's own models, not "
                "this script's: write it with monsoon.torch.export_layout(model, "
                "path, base_config) and start the shards with it"
                % _monsoon.flag("config"))
        difference = first_difference(layout_of(self._named), config["tensors"])
        if difference is not None:
            raise ValueError("this worker's model is not the run's: " + difference)
        self._batch_size = config["batch_size"]
        self._flatten()
        self._finished = False
        self._stop_signal = None
        self._watch = _watch_signals(self)
        try:
            self._worker = _monsoon.Worker(self._watch)
        except Error as e:
            _run_signal_handlers()  # Ctrl-C: KeyboardInterrupt from here
            if self._watch.signal == _SIGTERM:
                # Stopped while it connected: nothing trained, as ps_worker.
                _monsoon.write_report_of_no_steps(
                    "stopped by signal %d" % _SIGTERM)
                print("monsoon: rank %d stopped by signal %d before its first "
                      "step" % (rank(), _SIGTERM), file=sys.stderr, flush=True)
                sys.exit(128 + _SIGTERM)
            if not (config["elastic"] and str(e).startswith("OUT_OF_RANGE")):
                raise
            # Started after an elastic run's data was all trained (a
            # launcher's add as the run ends): nothing to do, as ps_worker.
            print("monsoon: rank %d has nothing left to train: %s"
                  % (rank(), e), file=sys.stderr, flush=True)
            _monsoon.write_report_of_no_steps("done: nothing left to train")
            sys.exit(0)
        _state["optimizer"] = self
        _finish_at_exit(self)
        self._install_push_rule(config)
        self._config = config  # until the first step
        self._install_hooks()

    def _install_push_rule(self, config):
        """What the pushed gradient takes from the wrapped optimizer's param
        groups (the class comment): where the mode pushes gradients (not
        easgd, which pushes elastic differences)."""
        self._transforms_pushes = self._worker.mode != "easgd"
        self._group_of = None
        self._rule_key = None
        self._rule = None  # (scale, weight_decay) per parameter; None: as is
        self._push = None  # the pushed values, where the rule changes them
        self._push_np = None
        self._step_rule = None  # the rule this step's parts were sent with
        if self._transforms_pushes:
            self._pushed_rule()
        _note_the_rule(config, self.optimizer, self._worker.step_replaces_params)

    def _map_groups(self):
        groups = self.optimizer.param_groups
        group_of = {}
        for i, group in enumerate(groups):
            for p in group["params"]:
                group_of[id(p)] = i
        self._group_of = [group_of.get(id(p)) for _, p in self._named]
        self._base_lr = [group.get("initial_lr", group["lr"]) for group in groups]

    def _pushed_rule(self):
        """(scale, weight_decay) per parameter from the param groups as they
        are now, or None where every pushed gradient is p.grad as it is."""
        groups = self.optimizer.param_groups
        if self._group_of is None or len(groups) != len(self._base_lr):
            self._map_groups()  # first, or after add_param_group
            self._rule_key = None
        # A frozen parameter (requires_grad False) has no gradient, which
        # torch's optimizers skip, weight decay and all.
        key = (tuple((group["lr"], group.get("weight_decay", 0) or 0)
                     for group in groups),
               tuple(p.requires_grad for _, p in self._named))
        if key == self._rule_key:
            return self._rule
        self._rule_key = key
        rule = []
        for i, (_, p) in zip(self._group_of, self._named):
            if i is None or not p.requires_grad:
                # Not the wrapped optimizer's, or frozen.
                rule.append((1.0, 0.0))
                continue
            lr, decay = key[0][i]
            base = self._base_lr[i]
            rule.append((float(lr) / base if base else 1.0, float(decay)))
        changes = any(r != (1.0, 0.0) for r in rule)
        self._rule = rule if changes else None
        if changes and self._push is None:
            self._push = torch.empty_like(self._grads)
            self._push_np = self._push.numpy()
        return self._rule

    def _fill_push(self, rule, low, high):
        """The pushed values of parameters [low, high): (g + wd * p) * scale,
        one pass per run of neighbours with the same rule."""
        i = low
        while i < high:
            j = i + 1
            while j < high and rule[j] == rule[i]:
                j += 1
            begin = self._views[i][0]
            end = self._views[j - 1][0] + self._views[j - 1][1]
            scale, decay = rule[i]
            out = self._push[begin:end]
            grad = self._grads[begin:end]
            if decay:
                torch.add(grad, self._params[begin:end], alpha=decay, out=out)
            else:
                out.copy_(grad)
            if scale != 1.0:
                out.mul_(scale)
            i = j

    def _flatten(self):
        sizes = [p.numel() for _, p in self._named]
        self._params = torch.empty(sum(sizes), dtype=torch.float32)
        self._grads = torch.zeros(sum(sizes), dtype=torch.float32)
        self._views = []
        offset = 0
        with torch.no_grad():
            for (_, p), n in zip(self._named, sizes):
                view = self._params[offset:offset + n].view_as(p)
                view.copy_(p.data)
                p.data = view
                p.grad = self._grads[offset:offset + n].view_as(p)
                self._views.append((offset, n))
                offset += n
        self._params_np = self._params.numpy()
        self._grads_np = self._grads.numpy()

    def _install_hooks(self):
        """Pushes during backward: a hook on each parameter's gradient
        accumulator (as Horovod's) says when its gradient is final; once
        every parameter from some offset to the end is, those values start
        on their way (_worker.ready), back to front, while backward
        computes the rest. The shards take them only at step(), and only if
        nothing changed since: a second backward pass before step(), a
        gradient changed in place after its hook (clip_grad_norm_), or a
        step(samples=) other than the one expected, and step() pushes the
        step whole instead (_overlap_withdrawn counts those)."""
        self._expected_samples = self._batch_size
        self._final = [False] * len(self._named)
        self._final_from = len(self._named)  # parameters [i, end) final
        self._overlap = None  # None: not started this step; True; False
        self._grads_version = None
        self._overlap_possible = True
        self._gave_up = False  # this step's parts were given up
        self._given_up_in_a_row = 0
        self._grad_pointers = [self._grads[o:o + n].data_ptr()
                               for o, n in self._views]
        self._accumulators = []
        self._said_sparse = False
        # Where backward's final gradients could first go (-1: nowhere
        # before step(), as with one shard smaller than a chunk): no hooks
        # then, and none of their cost.
        self._overlap_from = self._worker.overlap_from
        if self._overlap_from < 0:
            return
        for i, (_, p) in enumerate(self._named):
            if not p.requires_grad:
                continue
            # The node that adds into p.grad; kept, or the hook goes too.
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._hook_for(i))
            self._accumulators.append(accumulator)

    def _hook_for(self, i):
        def hook(*_):
            self._on_final(i)
        return hook

    def _on_final(self, i):
        if self._overlap is False or not self._overlap_possible:
            return
        p = self._named[i][1]
        if self._final[i] or p.grad is None:
            # Another backward pass before step(): what left is not the
            # step's.
            self._withdraw()
            return
        if p.grad.is_sparse or p.grad.data_ptr() != self._grad_pointers[i]:
            # A gradient of its own (after zero_grad(set_to_none=True),
            # torch 2's default, or sparse, from nn.Embedding(sparse=True)):
            # this backward's whole gradient, into the buffer with it.
            self._take_into_buffer(i)
        self._final[i] = True
        # Views share their base's version counter: an in-place change of
        # any gradient from here to step() moves it.
        self._grads_version = self._grads._version
        # Once parts go, each parameter made final goes: the values from
        # _final_from on have gone.
        sent_from = self._final_from
        low = self._final_from
        while low > 0 and self._final[low - 1]:
            low -= 1
        if low == self._final_from:
            return
        self._final_from = low
        if self._overlap is None:
            if self._views[low][0] > self._overlap_from:
                return  # nothing could go yet: the push starts later
            sent_from = len(self._named)  # the step's first part
            if self._transforms_pushes:
                self._step_rule = self._pushed_rule()  # for the whole step
        pushed = self._grads_np
        if self._step_rule is not None:
            self._fill_push(self._step_rule, low, sent_from)
            pushed = self._push_np
        self._overlap = self._worker.ready(pushed, self._params_np,
                                           self._expected_samples,
                                           self._views[low][0])
        if not self._overlap:
            self._overlap_possible = False  # the mode pushes otherwise

    def _withdraw(self):
        if self._overlap:
            self._worker.withdraw()
            self._gave_up = True
        self._overlap = False

    def _end_of_step(self):
        if self._gave_up:
            self._given_up_in_a_row += 1
            if self._given_up_in_a_row == _GIVE_UP_AFTER:
                # A script that changes its gradients after every backward
                # pass: the parts only cost it.
                self._overlap_possible = False
                print("monsoon: rank %d gave up its pushes during backward %d "
                      "steps in a row (the gradients changed after backward, "
                      "e.g. clipped or accumulated, or samples= differed): it "
                      "pushes after backward from now on "
                      "(push_after_backward: true in the run's config does so "
                      "from the start)" % (rank(), _GIVE_UP_AFTER),
                      file=sys.stderr, flush=True)
        elif self._overlap:
            self._given_up_in_a_row = 0
        self._gave_up = False
        self._final = [False] * len(self._named)
        self._final_from = len(self._named)
        self._step_rule = None
        self._overlap = None

    @property
    def _overlap_withdrawn(self):
        return self._worker.pushes_withdrawn

    def _take_into_buffer(self, i):
        """Parameter i's gradient, a tensor of its own, copied into its view
        of the buffer, which becomes p.grad again (dense: a sparse gradient
        is pushed whole, which rank 0 says once)."""
        name, p = self._named[i]
        offset, n = self._views[i]
        view = self._grads[offset:offset + n].view_as(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._said_sparse and rank() == 0:
                print("monsoon: parameter '%s' has sparse gradients (e.g. "
                      "nn.Embedding(sparse=True)): each step pushes it whole, "
                      "as a dense one; a table held on the shards row by row "
                      "is mt.sparse_pull's and mt.sparse_push's" % name,
                      file=sys.stderr, flush=True)
            self._said_sparse = True
            grad = grad.to_dense()
        view.copy_(grad)
        p.grad = view

    def _gather_grads(self):
        # Autograd adds into p.grad in place, so it normally is still the view;
        # a parameter without a gradient this step pushes zeros, and a
        # gradient of its own (set_to_none, sparse, replaced) is copied into
        # the buffer. Returns whether it wrote where parts have gone already
        # (parameters from _final_from on).
        wrote_sent = False
        for i, ((name, p), (offset, n)) in enumerate(zip(self._named,
                                                          self._views)):
            if p.grad is None:
                view = self._grads[offset:offset + n].view_as(p)
                view.zero_()
                p.grad = view
            elif p.grad.is_sparse or \
                    p.grad.data_ptr() != self._grad_pointers[i]:
                self._take_into_buffer(i)
            else:
                continue
            wrote_sent = wrote_sent or i >= self._final_from
        return wrote_sent

    @property
    def mode(self):
        return self._worker.mode

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def state_dict(self):
        """The wrapped optimizer's (its local steps' state)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group):
        raise RuntimeError(
            "monsoon.torch.DistributedOptimizer cannot take parameters after it "
            "was made: the run's model is the parameters it was made with")

    def __repr__(self):
        return "DistributedOptimizer(%s, mode=%s)" % (
            self.optimizer.__class__.__name__, self._worker.mode)

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (they are views into one buffer)."""
        self._grads.zero_()

    def pull(self):
        """The shards' current weights into the model's parameters."""
        self._waiting(self._worker.pull, self._params_np)

    def _waiting(self, call, *args):
        """A call on the shards that may wait long (a lost shard ridden out,
        an elastic worker waiting for data). SIGTERM ends it at once
        (_watch_signals), and the script stops as after a step (_stop)."""
        try:
            return call(*args)
        except Error:
            _run_signal_handlers()  # Ctrl-C: KeyboardInterrupt from here
            self._stop_if_terminated()
            raise

    def _stop_if_terminated(self):
        """After SIGTERM came while a call waited on the shards (the watch
        saw it, and ended the call): stop as after a step."""
        if self._watch.signal == _SIGTERM:
            self._stop_signal = _SIGTERM
            self._stop()

    def step(self, closure=None, samples=None):
        """The mode's step on the gradients of the last backward pass.
        `samples`: the examples they sum over (default: the config's
        batch_size)."""
        loss = closure() if closure is not None else None
        if self._overlap and self._grads._version != self._grads_version:
            self._withdraw()  # changed in place after backward (clipped)
        if self._gather_grads() and self._overlap:
            self._withdraw()  # a gradient that went, replaced after its hook
        if self._config is not None:  # the first step
            _note_the_schedule(self._config, self.optimizer)
            self._config = None
        pushed = self._grads_np
        if self._transforms_pushes:
            rule = self._pushed_rule()
            if self._overlap and rule is not self._step_rule:
                self._withdraw()  # the lr or weight decay changed after backward
            if rule is not None:
                # What the parts sent during backward did not cover.
                self._fill_push(rule, 0, self._final_from
                                if self._overlap else len(self._named))
                pushed = self._push_np
        samples = int(samples or self._batch_size)
        try:
            replaced = self._waiting(self._worker.step, pushed, samples,
                                     self._params_np)
        finally:
            self._end_of_step()
        self._expected_samples = samples
        if not replaced:
            self.optimizer.step()
            self._waiting(self._worker.after_local_step, self._params_np)
        if self._stop_signal is not None:
            self._stop()
        return loss

    def _stop(self):
        """After SIGTERM (a launcher's time limit, Kubernetes stopping a
        pod): the step in flight is done, or given up if the signal came
        during it; leave without finishing the run, write the report and
        exit 128 + the signal, as ps_worker does."""
        number = self._stop_signal
        if not self._finished:
            self._finished = True
            self._worker.finish(self._params_np, False,
                                "stopped by signal %d" % number)
        print("monsoon: rank %d stopped by signal %d after %d steps"
              % (rank(), number, self._worker.steps), file=sys.stderr,
              flush=True)
        sys.exit(128 + number)

    def finish(self, finished=True):
        """See monsoon.torch.finish; once (later calls do nothing)."""
        if self._finished:
            return
        self._finished = True
        if not self._worker.finish(self._params_np, finished):
            # Stopped while it finished, its last calls cut short (the
            # report says so).
            self._stop_if_terminated()

    @property
    def steps(self):
        return self._worker.steps

    @property
    def data_shards(self):
        """Elastic runs: the data shards this worker has taken."""
        return self._worker.data_shards

    @property
    def resume_point(self):
        return self._worker.resume_point

    @property
    def bytes_pushed(self):
        return self._worker.bytes_pushed

    @property
    def bytes_pulled(self):
        return self._worker.bytes_pulled


def _close(a, b):
    return abs(float(a) - float(b)) <= 1e-6 * max(abs(float(a)), abs(float(b)))


def _note_the_rule(config, optimizer, takes_no_step):
    """Rank 0 says once, on stderr, where the run's rule and the wrapped
    optimizer part: what the shards apply in a mode where the wrapped
    optimizer takes no step, and the config's weight decay, which ps_worker
    adds itself and a script through its optimizer."""
    if rank() != 0:
        return
    groups = optimizer.param_groups
    name = optimizer.__class__.__name__
    mode = config["mode"]
    if takes_no_step and groups:
        group = groups[0]
        lr = group.get("initial_lr", group["lr"])
        momentum = group.get("momentum", 0) or 0
        same = (name.lower() == config["optimizer"]
                and _close(lr, config["learning_rate"])
                and (config["optimizer"] != "sgd"
                     or _close(momentum, config["momentum"])))
        if not same:
            rule = "%s, learning_rate %g" % (config["optimizer"],
                                             config["learning_rate"])
            if config["optimizer"] == "sgd":
                rule += ", momentum %g" % config["momentum"]
            print("monsoon: in %s the shards apply each step with the run's "
                  "rule (%s); the wrapped %s (lr %g) takes no step: its weight "
                  "decay and the changes of its lr (a scheduler) reach the "
                  "pushed gradient, its rule and rate do not (the run's config "
                  "sets them: optimizer, learning_rate, momentum)"
                  % (mode, rule, name, lr), file=sys.stderr, flush=True)
    decay = config["weight_decay"]
    if decay and not any(_close(g.get("weight_decay", 0) or 0, decay)
                         for g in groups):
        print("monsoon: the run's config has weight_decay %g, which ps_worker "
              "adds to its gradients; a script's weight decay is its "
              "optimizer's, and the wrapped %s has none of %g (give it "
              "weight_decay=mt.run_config()['weight_decay'])"
              % (decay, name, decay), file=sys.stderr, flush=True)


def _note_the_schedule(config, optimizer):
    """At the first step (a script makes its scheduler before its loop),
    rank 0 says once when the config schedules the rates and no scheduler
    is on the wrapped optimizer."""
    if rank() != 0:
        return
    if config["lr_decay_epochs"] > 0 and not any(
            "initial_lr" in g for g in optimizer.param_groups):
        print("monsoon: the run's config decays the rates by %g every %d "
              "epochs, which ps_worker does itself; a script schedules its "
              "optimizer's lr (a torch.optim.lr_scheduler on the "
              "DistributedOptimizer, stepped each epoch), and the shards' rule "
              "follows it" % (config["lr_decay_factor"],
                              config["lr_decay_epochs"]),
              file=sys.stderr, flush=True)


def _finish_at_exit(optimizer):
    """A script that ends without mt.finish() finishes at exit, as one
    would expect of a script that reached its end; one that ends on an
    uncaught exception does not (its rank did not finish: the launcher sees
    its exit code)."""
    import atexit
    import weakref

    if not _state.get("exit_hooks"):
        _state["exit_hooks"] = True
        previous = sys.excepthook

        def note_crash(kind, value, traceback):
            _state["crashed"] = True
            previous(kind, value, traceback)

        sys.excepthook = note_crash
    ref = weakref.ref(optimizer)

    def at_exit():
        opt = ref()
        if opt is None or opt._finished or _state.get("crashed"):
            return
        try:
            opt.finish()
        except Error as error:
            print("monsoon: rank %d could not finish at exit: %s"
                  % (rank(), error), file=sys.stderr, flush=True)

    atexit.register(at_exit)


def _watch_signals(optimizer):
    """The worker's _monsoon.SignalWatch. Where the script left Python's
    defaults for them: SIGTERM ends the script at the end of its step
    (opt._stop) rather than at once, and SIGTERM or SIGINT (Ctrl-C) that
    comes while a call waits on the shards ends the wait at once (Python
    would run its handler only once the call returned, minutes later when a
    lost shard is ridden out). Their numbers reach the watch through
    Python's wakeup fd, unless the script uses that itself."""
    import threading

    watched = []
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

            def on_sigterm(number, frame):
                optimizer._stop_signal = number

            signal.signal(signal.SIGTERM, on_sigterm)
            watched.append(signal.SIGTERM)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            watched.append(signal.SIGINT)
    if not watched:
        return _monsoon.SignalWatch(-1, -1, [])
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if previous != -1:  # the script's own
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        return _monsoon.SignalWatch(-1, -1, [])
    if not _state.get("wakeup_fork_hook"):
        # A DataLoader's worker processes are forks: a signal to one of them
        # is not the script's.
        _state["wakeup_fork_hook"] = True
        os.register_at_fork(after_in_child=_no_wakeup_fd)
    return _monsoon.SignalWatch(read_end, write_end, watched)


def _run_signal_handlers():
    """Python runs the handlers of signals that came during a call into C++
    on entering a Python function: here, rather than later amid the
    printing of a traceback."""


def _no_wakeup_fd():
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # not the main thread: no Python handler runs there
        pass


class _Params:
    """Something with named_parameters(), for export_layout."""

    def __init__(self, named):
        self._named = named

    def named_parameters(self):
        return iter(self._named)


def _optimizer(what):
    _require_init(what)
    opt = _state.get("optimizer")
    if opt is None:
        raise RuntimeError(
            "monsoon.torch.%s before a DistributedOptimizer was made: wrap the "
            "optimizer first (it connects to the shards)" % what)
    return opt


def _sparse_client(what):
    """What calls the shards for a sparse call: the worker's, or (in
    evaluate_every's eval_fn) the evaluator's."""
    _require_init(what)
    if _state.get("observer") is not None:
        return _state["observer"]
    optimizer = _state.get("optimizer")
    if optimizer is None:
        raise RuntimeError(
            "monsoon.torch.%s before monsoon.torch.DistributedOptimizer: make "
            "the optimizer first (it connects to the shards)" % what)
    return optimizer._worker


def _sparse_dim(table):
    tables = run_config()["sparse_tables"]
    if table not in tables:
        raise ValueError("no sparse table %r in the run's config (its tables: "
                         "%s)" % (table, ", ".join(sorted(tables)) or "none"))
    return tables[table]


def sparse_pull(table, ids):
    """The rows of sparse table `table` (the config's sparse_tables) for
    `ids`, an int64 tensor of any shape: a float32 tensor of shape
    ids.shape + (dim,). Each id is asked of the shard that owns it, repeats
    once; a row not made yet reads as its initial values. Also in the
    evaluator's eval_fn (evaluate_every)."""
    client = _sparse_client("sparse_pull")
    ids = ids.detach().to(torch.int64).contiguous()
    out = torch.empty(tuple(ids.shape) + (_sparse_dim(table),),
                      dtype=torch.float32)
    client.sparse_pull(table, ids.numpy(), out.numpy())
    return out


def sparse_push(table, ids, grads):
    """Row gradients `grads` (float32, shape ids.shape + (dim,)) of `ids` to
    the shards, repeats summed, applied at once with the table's optimizer
    and the run's learning rate, once even when a lost shard makes it go
    again. Returns what the shards did: updated, created, not_admitted,
    evicted."""
    if is_evaluator():
        raise RuntimeError("monsoon.torch.sparse_push in the evaluator: only "
                           "workers push")
    client = _sparse_client("sparse_push")
    ids = ids.detach().to(torch.int64).contiguous()
    dim = _sparse_dim(table)
    grads = grads.detach().to(torch.float32).contiguous()
    if tuple(grads.shape) != tuple(ids.shape) + (dim,):
        raise ValueError("sparse_push: grads of shape %s for ids of shape %s "
                         "and table %r of dim %d; give ids.shape + (dim,)"
                         % (tuple(grads.shape), tuple(ids.shape), table, dim))
    return client.sparse_push(table, ids.numpy(), grads.numpy())


def broadcast_parameters(model=None):
    """Every worker starts from the shards' weights: pulls them into the
    model's parameters (those the DistributedOptimizer was given)."""
    _optimizer("broadcast_parameters").pull()


def finish(finished=True):
    """Pushes what is still summed, then leaves the shards; with `finished`
    the rank counts as done, so that the run can end. A script that ends
    without calling it finishes at exit (not after an uncaught exception)."""
    _optimizer("finish").finish(finished)


def resume_point():
    """The examples of this rank's data that the shards had applied when
    its DistributedOptimizer connected: 0 in a fresh run; for a script that
    a launcher (or Kubernetes) started again after it died, where its data
    resumes, as ps_worker's does. A script that skips that many examples of
    its order (an epoch's worth, then the rest) trains each once."""
    return _optimizer("resume_point").resume_point


def is_elastic():
    """Whether the run is elastic (its config's `elastic: true`, which
    `launch_local --elastic` sets): workers join and leave while it runs, and
    each trains the batches shard 0's queue hands it (Batches), not a part
    of the data split by rank."""
    return bool(run_config()["elastic"])


class Batches:
    """The batches this worker is to train, the ones ps_worker would:
    iterating gives the indices (an int64 tensor of batch_size) of each, in
    a training set of `num_examples` (every worker's must hold as many).

    - A fixed run: the rank's part of the set (the rank-th contiguous 1/W),
      shuffled each epoch from the run's seed, the rank and the epoch, in
      whole batches, every rank as many (the smallest part's). A script
      started again after it died (a launcher's restart, a Kubernetes
      pod's) resumes after the examples the shards had applied, so each
      example is trained once.
    - An elastic run (is_elastic()): the data shards shard 0's queue hands
      this worker, each epoch the whole set shuffled from the seed, cut into
      whole batches, 8 to a data shard (the config's data_shard_batches).
      It ends when every data shard of every epoch has been trained by some
      worker; a shard whose worker left or died goes back to the queue,
      and a worker with nothing left waits for such ones (saying so every
      5 s). In sync a worker that waits steps out of the run meanwhile and,
      when it takes a shard again, pulls the current weights into the model
      before its next batch.

    Train every batch it gives, in order, one opt.step() each (the shards
    count the examples a worker steps; a step of another size, or without a
    batch, is refused with the reason). Batches may be taken ahead, as a
    DataLoader with worker processes does (batch_sampler=), except in an
    elastic sync run, where a worker with nothing left to take steps out of
    the run: there take each batch once the one before was stepped, loading
    its examples in the loop:

        for indices in mt.Batches(len(train_set)):
            x, y = train_x[indices], train_y[indices]
            ...; loss.backward(); opt.step()

    `epoch` (0-based), `batch` (0-based, within the epoch) and
    `batches_per_epoch` describe the batch last given (with a DataLoader
    taking batches ahead, a later one than the batch being trained);
    `data_shards` counts the data shards taken (elastic runs)."""

    def __init__(self, num_examples):
        self._n = int(num_examples)
        self._orders = {}  # the epochs' orders in use, at most two
        self.epoch = None
        self.batch = None
        self.batches_per_epoch = None

    @property
    def data_shards(self):
        return _optimizer("Batches").data_shards

    def __iter__(self):
        opt = _optimizer("Batches")
        size = opt._batch_size
        while True:
            nxt = opt._waiting(opt._worker.next_batch, self._n)
            if nxt["finished"]:
                return
            if nxt["rejoined"]:
                opt.pull()  # out of the steps while it waited: weights old
            epoch = nxt["epoch"]
            order = self._orders.get(epoch)
            if order is None:
                # Elastic: a put-back shard of an earlier epoch comes first,
                # then the current epoch goes on; two orders cover both.
                if len(self._orders) >= 2:
                    del self._orders[min(self._orders)]
                order = torch.from_numpy(
                    opt._worker.epoch_order(epoch, self._n))
                self._orders[epoch] = order
            self.epoch = epoch
            self.batch = nxt["batch"]
            self.batches_per_epoch = nxt["batches_per_epoch"]
            yield order[self.batch * size:(self.batch + 1) * size]


def _batch_norms(model):
    """The names of `model`'s BatchNorm modules that keep running
    statistics."""
    return [name for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
            and m.track_running_stats]


def evaluate_every(model, eval_fn, interval_s=None, bn_batches=None):
    """The evaluator's loop: every `interval_s` (default MONSOON_INTERVAL_S,
    2 s) pulls the shards' current weights into `model`'s parameters, calls
    eval_fn(model) -> (test_accuracy, test_loss) and adds a point to the
    run's curve (MONSOON_CURVE_OUT, the text-format monsoon.EvalCurve the C++
    evaluator writes). Returns after a last evaluation once every worker has
    finished (SIGTERM is then ignored: the script may exit in peace), after
    a last evaluation on SIGTERM, or at once on SIGINT (as the C++
    evaluator: the launchers stop a failed run's evaluator with SIGINT);
    returns the curve's points as dicts.

    A model with BatchNorm needs `bn_batches`: its running statistics are
    buffers, each worker's own, which no shard holds, so the evaluator's
    own would be the untrained ones. `bn_batches` (training inputs: a list
    of tensors, or a DataLoader of (input, target); iterated at every
    evaluation) recomputes them from the pulled weights before each
    evaluation (torch.optim.swa_utils.update_bn, as for averaged weights)."""
    import threading

    _require_init("evaluate_every")
    if not is_evaluator():
        raise RuntimeError(
            "monsoon.torch.evaluate_every in a worker (rank %d): only the "
            "evaluator (MONSOON_RANK=-1, started so by the launchers) "
            "evaluates; check mt.is_evaluator() first" % rank())
    named = list(model.named_parameters())
    for name, p in named:
        _check_tensor(name, p)
    config = run_config()
    difference = first_difference(layout_of(named), config["tensors"])
    if difference is not None:
        raise ValueError("the evaluator's model is not the run's: " + difference)
    norms = _batch_norms(model)
    if norms and bn_batches is None:
        raise ValueError(
            "the evaluator's model has BatchNorm running statistics (module%s "
            "%s), which are each worker's own and reach no shard: evaluated "
            "with its own, never trained, its accuracy would be wrong. Pass "
            "evaluate_every(model, eval_fn, bn_batches=B), B some training "
            "inputs (a list of tensors, or a DataLoader of (input, target)), "
            "over which the statistics are recomputed from the pulled weights "
            "before each evaluation"
            % ("s" if len(norms) > 1 else "",
               ", ".join("'%s'" % n for n in norms)))
    interval = float(interval_s if interval_s is not None
                     else _monsoon.flag("interval_s"))
    params = torch.empty(sum(p.numel() for _, p in named), dtype=torch.float32)
    params_np = params.numpy()
    observer = _monsoon.Observer()
    _state["observer"] = observer  # for sparse_pull in eval_fn
    stop = threading.Event()
    signals = {}
    received = []

    def on_signal(number, frame):
        received.append(number)
        stop.set()

    for number in (signal.SIGTERM, signal.SIGINT):
        signals[number] = signal.signal(number, on_signal)
    points = []
    try:
        last = False
        while not last:
            last = stop.wait(interval)
            if last and received[0] == signal.SIGINT:
                print("monsoon: SIGINT: the evaluator stops without a last "
                      "evaluation", file=sys.stderr, flush=True)
                break
            finished = not last and observer.every_worker_finished()
            last = last or finished
            try:
                point = observer.snapshot(params_np)
            except Error as error:
                if last and not stop.is_set():
                    raise  # the run ended and its weights cannot be read
                # Stopped (a launcher ending a run, often one that failed,
                # whose shards may be gone first): no last evaluation.
                print("monsoon: cannot evaluate now: %s%s" % (
                    error, "; stopped by a signal, so no last evaluation"
                    if last else ""), file=sys.stderr, flush=True)
                if last:
                    break
                continue
            offset = 0
            with torch.no_grad():
                for _, p in named:
                    n = p.numel()
                    p.copy_(params[offset:offset + n].view_as(p))
                    offset += n
            if norms:
                torch.optim.swa_utils.update_bn(bn_batches, model)
            was_training = model.training
            model.eval()
            try:
                accuracy, loss = eval_fn(model)
            finally:
                model.train(was_training)
            point["test_accuracy"] = float(accuracy)
            point["test_loss"] = float(loss)
            observer.record(point, finished)
            points.append(point)
            print("eval: %.1f s  samples %d  version %d  test accuracy %.4f  "
                  "loss %.4f%s" % (point["time_s"], point["samples"],
                                   point["version"], accuracy, loss,
                                   "  (final)" if last else ""), flush=True)
    finally:
        for number, handler in signals.items():
            signal.signal(number, handler)
        if points and last and not stop.is_set():
            # The run ended and its last point is written: the launcher's
            # SIGTERM, which may come while the script exits, has nothing
            # left to stop.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return points
