"""LeNet on Fashion-MNIST in PyTorch, trained through Monsoon's shards.

A plain PyTorch script with the monsoon.torch lines added (marked "# +").
Rank r trains examples r, r + W, r + 2W, ... of the training set, shuffled
each epoch; rank 0 prints the test accuracy after each epoch. In an elastic
run (workers join and leave) each worker trains the batches shard 0's queue
hands it instead. The data is
Debian's dataset-fashion-mnist (tools/setup.sh installs it).

With the launchers, every mode on the same script (the script also runs as
the evaluator):
  launch_local --worker_cmd='python3 lenet_fashion_mnist.py' --mode=sync
  compare_modes --worker_cmd='python3 lenet_fashion_mnist.py' --epochs=2
  launch_local --worker_cmd='python3 lenet_fashion_mnist.py' --elastic \\
      --chaos=add:worker@5s,remove:worker1@10s

By hand, with two shards and two workers (the README's "Bring your own
model"):
  MONSOON_EXPORT_LAYOUT=run.config MONSOON_CONFIG=base.config \\
      python3 lenet_fashion_mnist.py          # writes run.config, exits
  ps_server --shard=0 --num_shards=2 --num_workers=2 --config=run.config \\
      --listen=127.0.0.1:5000 &               # and shard 1 on :5001
  MONSOON_SERVERS=127.0.0.1:5000,127.0.0.1:5001 MONSOON_CONFIG=run.config \\
      MONSOON_NUM_WORKERS=2 MONSOON_RANK=0 python3 lenet_fashion_mnist.py &
  # ... and MONSOON_RANK=1
"""

import argparse
import gzip
import struct

import numpy
import torch
import torch.nn as nn
import torch.nn.functional as F

import monsoon.torch as mt  # +


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return numpy.frombuffer(data, dtype=numpy.uint8,
                            offset=4 + 4 * dims).reshape(shape)


def load(data_dir, split):
    images = read_idx("%s/%s-images-idx3-ubyte.gz" % (data_dir, split))
    labels = read_idx("%s/%s-labels-idx1-ubyte.gz" % (data_dir, split))
    x = torch.from_numpy(images.astype(numpy.float32) / 255.0).unsqueeze(1)
    return (x - 0.2860) / 0.3530, torch.from_numpy(labels.astype(numpy.int64))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        # Channels last: PyTorch's oneDNN convolutions take a step on a
        # batch of 64 in about 3.0 ms this way against 3.8 ms (one CPU
        # thread); the values are the same, only their layout in memory.
        x = x.to(memory_format=torch.channels_last)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def evaluate(model, x, y, batch=500):
    """(test accuracy, test loss), what mt.evaluate_every wants.

    In batches: one pass over all 10,000 test images at once takes 15 times
    as long (the first convolution's output, 188 MB, leaves the cache), and
    the evaluator's passes share the cores with the workers.
    """
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = model(x[i:i + batch])
            correct += (out.argmax(1) == y[i:i + batch]).sum().item()
            loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
    return correct / len(x), loss / len(x)


def train_elastic(model, opt, x, y, config):
    """An elastic run: the batches of the data shards shard 0's queue hands
    this worker, until every epoch is trained; the rate of each batch's
    epoch (a data shard put back may be of an epoch before)."""
    batches = mt.Batches(len(x))  # +
    rate = None
    for batch in batches:
        if config["lr_decay_epochs"] > 0:
            scale = config["lr_decay_factor"] ** (
                batches.epoch // config["lr_decay_epochs"])
            if scale != rate:
                for group in opt.param_groups:
                    group.setdefault("initial_lr", group["lr"])
                    group["lr"] = group["initial_lr"] * scale
                rate = scale
        opt.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()
    print("rank %d: %d data shards trained" % (mt.rank(), batches.data_shards),
          flush=True)
    mt.finish()  # +


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=None,
                        help="default: the run config's")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="default: the run config's")
    parser.add_argument("--lr", type=float, default=None,
                        help="the local steps' rate (easgd, downpour with "
                        "n_push > 1); default: the run config's "
                        "local_learning_rate, as the C++ worker")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    mt.init()  # +
    torch.manual_seed(args.seed)
    model = LeNet()
    if mt.is_evaluator():  # the launchers' evaluator: the same script, rank -1
        test_x, test_y = load(args.data_dir, "t10k")
        mt.evaluate_every(model, lambda m: evaluate(m, test_x, test_y))
        return
    # The data first: a worker is a member of the run from its
    # DistributedOptimizer on, and sync steps wait for a member (a worker
    # joining an elastic run would hold every step up while it loads).
    x, y = load(args.data_dir, "train")
    test_x, test_y = load(args.data_dir, "t10k")
    config = mt.run_config()
    # The run's weight decay and step schedule (a preset's, as ps_worker
    # applies them): the wrapped optimizer's, which reach the shards' rule
    # through the pushed gradient in every mode.
    opt = torch.optim.SGD(model.parameters(),
                          lr=args.lr or config["local_learning_rate"],
                          momentum=config["local_momentum"],
                          weight_decay=config["weight_decay"])
    opt = mt.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # +
    mt.broadcast_parameters(model)  # +
    rank, workers = mt.rank(), mt.num_workers()  # +
    args.epochs = args.epochs or config["epochs"]
    args.batch_size = args.batch_size or config["batch_size"]
    mine = torch.arange(rank, len(x), workers)
    steps = len(x) // workers // args.batch_size  # the same for every rank
    # Started again after a failure (a launcher's restart), the script
    # resumes its data where the shards' count of its examples ends.
    done = mt.resume_point() // args.batch_size
    first_epoch = done // steps
    if done:
        print("rank %d resumes at epoch %d, step %d" % (
            rank, first_epoch + 1, done % steps), flush=True)
    if mt.is_elastic():  # + workers join and leave: no split by rank
        train_elastic(model, opt, x, y, config)
        return
    schedule = None
    if config["lr_decay_epochs"] > 0:
        decay = config["lr_decay_factor"]
        schedule = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda e: decay ** ((first_epoch + e) // config["lr_decay_epochs"]))
    for epoch in range(first_epoch, args.epochs):
        order = mine[torch.randperm(len(mine), generator=torch.Generator()
                                    .manual_seed(args.seed * 1000 + epoch))]
        for step in range(done % steps if epoch == first_epoch else 0, steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step(samples=len(batch))
        if schedule is not None:
            schedule.step()
        if rank == 0:
            print("epoch %d: test accuracy %.4f" % (epoch + 1,
                                                     evaluate(model, test_x, test_y)[0]),
                  flush=True)
    mt.finish()  # +


if __name__ == "__main__":
    main()
