"""A click model with embeddings held on Monsoon's shards: a PyTorch MLP on
13 dense features and 26 categorical ones, each id's embedding a row of the
run's sparse table "emb" (pulled and pushed by id with mt.sparse_pull and
mt.sparse_push), the MLP's parameters through the DistributedOptimizer as in
every other script: the hybrid Persia reports, sparse rows applied as they
arrive, dense parameters in the run's mode.

The data: libsvm files as tools/make_click_data writes them (train.libsvm,
test.libsvm; "LABEL 0:0:x0 ... 12:12:x12 13:ID:1 ... 38:ID:1"). The config
must hold the table:

  make_click_data --out=/tmp/click --examples=100000
  printf 'sparse_tables { name: "emb" dim: 8 max_rows: 2000000 }\\n' > click.textproto
  launch_local --config=click.textproto --mode=downpour \\
      --worker_cmd='python3 click_embeddings.py --data_dir=/tmp/click'

Rank 0 prints the test AUC and log loss after each epoch; the evaluator's
curve holds accuracy and log loss.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import monsoon.torch as mt  # +

DENSE, CATEGORICAL = 13, 26


def load(path, limit=None):
    """(dense [N, 13] float32, ids [N, 26] int64, labels [N] float32)."""
    dense, ids, labels = [], [], []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            labels.append(float(parts[0]))
            d, c = [0.0] * DENSE, [0] * CATEGORICAL
            for feature in parts[1:]:
                field, fid, value = feature.split(":")
                field = int(field)
                if field < DENSE:
                    d[field] = float(value)
                else:
                    # ids are below 2^63 (field << 48 | rank): int64 holds them
                    c[field - DENSE] = int(fid)
            dense.append(d)
            ids.append(c)
            if limit and len(labels) >= limit:
                break
    return (torch.tensor(dense), torch.tensor(ids, dtype=torch.int64),
            torch.tensor(labels))


class Mlp(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Linear(DENSE + CATEGORICAL * dim, 64)
        self.fc2 = nn.Linear(64, 1)

    def forward(self, dense, rows):
        x = torch.cat([dense, rows.flatten(1)], dim=1)
        return self.fc2(F.relu(self.fc1(x))).squeeze(1)


def auc(scores, labels):
    """The chance that a click scores above a non-click (ties half)."""
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    # ties: mean rank within equal scores
    unique, inverse = torch.unique(scores, return_inverse=True)
    sums = torch.zeros(len(unique)).index_add_(0, inverse, ranks)
    counts = torch.zeros(len(unique)).index_add_(0, inverse, torch.ones_like(ranks))
    ranks = (sums / counts)[inverse]
    positives = labels.sum()
    negatives = len(labels) - positives
    return ((ranks[labels > 0.5].sum() - positives * (positives + 1) / 2)
            / (positives * negatives)).item()


def evaluate(model, dense, ids, labels, batch=2000):
    """(accuracy, log loss), and the AUC, with the shards' rows."""
    scores = []
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            rows = mt.sparse_pull("emb", ids[i:i + batch])  # +
            scores.append(model(dense[i:i + batch], rows))
    logits = torch.cat(scores)
    loss = F.binary_cross_entropy_with_logits(logits, labels).item()
    accuracy = ((logits > 0).float() == labels).float().mean().item()
    return accuracy, loss, auc(logits, labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default="/tmp/click")
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N lines only")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    mt.init()  # +
    config = mt.run_config()
    if "emb" not in config["sparse_tables"]:
        raise SystemExit("click_embeddings: the run's config needs a sparse "
                         "table 'emb' (see this script's docstring)")
    dim = config["sparse_tables"]["emb"]
    torch.manual_seed(args.seed)
    model = Mlp(dim)
    if mt.is_evaluator():  # +
        test = load(args.data_dir + "/test.libsvm")
        mt.evaluate_every(model, lambda m: evaluate(m, *test)[:2])  # +
        return
    opt = torch.optim.SGD(model.parameters(), lr=config["local_learning_rate"],
                          momentum=config["local_momentum"])
    opt = mt.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # +
    mt.broadcast_parameters(model)  # +
    dense, ids, labels = load(args.data_dir + "/train.libsvm", args.limit)
    test = load(args.data_dir + "/test.libsvm")
    rank, workers = mt.rank(), mt.num_workers()  # +
    batch = config["batch_size"]
    mine = torch.arange(rank, len(labels), workers)
    steps = len(labels) // workers // batch
    for epoch in range(config["epochs"]):
        order = mine[torch.randperm(len(mine), generator=torch.Generator()
                                    .manual_seed(args.seed * 1000 + epoch))]
        for step in range(steps):
            b = order[step * batch:(step + 1) * batch]
            rows = mt.sparse_pull("emb", ids[b]).requires_grad_()  # +
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(dense[b], rows),
                                                      labels[b])
            loss.backward()
            mt.sparse_push("emb", ids[b], rows.grad)  # +
            opt.step(samples=len(b))
        if rank == 0:
            accuracy, logloss, test_auc = evaluate(model, *test)
            print("epoch %d: test AUC %.4f, log loss %.4f, accuracy %.4f"
                  % (epoch + 1, test_auc, logloss, accuracy), flush=True)
    mt.finish()  # +


if __name__ == "__main__":
    main()
