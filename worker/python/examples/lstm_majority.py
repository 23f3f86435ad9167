"""An LSTM on a sequence task, trained through Monsoon's shards: a model
Monsoon's C++ workers cannot express (an embedding and a recurrent layer).

The task: a sequence of 24 tokens from 10 says which token occurs most
often in it (ties: the smallest such token), a 10-class classification.
The script makes its data from a seed, the same in every process, so it
needs no download: 24,000 training sequences (rank r trains r, r + W, ...,
shuffled each epoch) and 4,000 test sequences for the evaluator.

Under the launchers (the script is also the evaluator):
  launch_local --worker_cmd='python3 lstm_majority.py' --mode=downpour
  compare_modes --worker_cmd='python3 lstm_majority.py' --epochs=4
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import monsoon.torch as mt  # +

TOKENS, LENGTH = 10, 24


def make_data(count, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, TOKENS, (count, LENGTH), generator=g)
    counts = F.one_hot(x, TOKENS).sum(1)
    # argmax takes the first of equal counts: the smallest token.
    return x, counts.argmax(1)


class MajorityLstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(TOKENS, 16)
        self.lstm = nn.LSTM(16, 64, batch_first=True)
        self.out = nn.Linear(64, TOKENS)

    def forward(self, x):
        _, (h, _) = self.lstm(self.embed(x))
        return self.out(h[-1])


def evaluate(model, x, y):
    """(test accuracy, test loss), what mt.evaluate_every wants."""
    with torch.no_grad():
        out = model(x)
        return ((out.argmax(1) == y).float().mean().item(),
                F.cross_entropy(out, y).item())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=None,
                        help="default: the run config's")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="default: the run config's")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="the local steps' rate (downpour with n_push > 1, easgd)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    mt.init()  # +
    torch.manual_seed(args.seed)
    model = MajorityLstm()
    if mt.is_evaluator():  # the launchers' evaluator: the same script, rank -1
        test_x, test_y = make_data(4000, seed=2)
        mt.evaluate_every(model, lambda m: evaluate(m, test_x, test_y))
        return
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    opt = mt.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # +
    mt.broadcast_parameters(model)  # +
    config = mt.run_config()
    epochs = args.epochs or config["epochs"]
    batch_size = args.batch_size or config["batch_size"]
    x, y = make_data(24000, seed=1)
    rank, workers = mt.rank(), mt.num_workers()  # +
    mine = torch.arange(rank, len(x), workers)
    steps = len(x) // workers // batch_size  # the same for every rank
    for epoch in range(epochs):
        order = mine[torch.randperm(len(mine), generator=torch.Generator()
                                    .manual_seed(args.seed * 1000 + epoch))]
        for step in range(steps):
            batch = order[step * batch_size:(step + 1) * batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step(samples=len(batch))
    mt.finish()  # +


if __name__ == "__main__":
    sys.exit(main())
