"""A MovieLens recommender, Horovod style: predict a user's rating of a movie, on ratings.csv.

The tutorials' recommender (matrix factorisation on ml-latest-small), made data-parallel the Horovod
way: ``hvd.init()``, ratings sharded with ``DistributedSampler``, learning rate scaled by the number
of workers, ``hvd.DistributedOptimizer`` averaging the embedding gradients, rank 0's initial state
broadcast to all. The test RMSE is summed over every worker's shard with ``hvd.allreduce`` (an exact
RMSE, not a mean of per-worker RMSEs) and printed beside the baseline that always predicts the
training set's mean rating: a model worth having beats it.

Data: ``ml-latest-small/ratings.csv`` (from https://grouplens.org/datasets/movielens/) below
``--data-dir``, or in ringtrain's cache (``--download`` fetches it there). Without either, the script
says so and trains on synthetic ratings of the same form (hidden low-rank tastes plus noise), so it
runs from a fresh clone. Run on two local processes:

    ringtrain run -np 2 python examples/movielens_recommender.py --epochs 5
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import ringtrain as hvd
from ringtrain.exceptions import DataError
from ringtrain.workloads import get_workload
from ringtrain.workloads.base import Workload
from ringtrain.workloads.dataset import TensorPairDataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="MovieLens ratings with the Horovod API of ringtrain")
    parser.add_argument("--data-dir", default=None, help="folder holding ml-latest-small/ratings.csv "
                        "(default: ringtrain's cache, else synthetic ratings)")
    parser.add_argument("--download", action="store_true", help="fetch ml-latest-small into the cache")
    parser.add_argument("--arch", choices=["mf", "ncf"], default="mf",
                        help="biased matrix factorisation or neural collaborative filtering")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256, help="ratings per step on each worker")
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate for a single worker")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error(f"--epochs {args.epochs}: train for at least one epoch")
    return args


def load_ratings(args: argparse.Namespace) -> tuple[Workload, TensorPairDataset, TensorPairDataset]:
    """MovieLens from --data-dir or the cache; synthetic ratings when neither was asked for nor found."""
    workload = get_workload("movielens")
    try:
        return workload, *workload.datasets(data_dir=args.data_dir, download=args.download)
    except DataError as exc:
        if args.data_dir is not None or args.download:  # asked for and missing: say which, no traceback
            sys.exit(f"error: {exc}")
    if hvd.rank() == 0:
        print("no MovieLens ratings in ringtrain's cache: training on synthetic ratings instead. HINT: "
              "--data-dir DIR (holding ml-latest-small/ratings.csv) or --download for the real ones",
              flush=True)
    workload = get_workload("synthetic-ratings")
    return workload, *workload.datasets(seed=args.seed)


def squared_error_sum(model: torch.nn.Module, loader: DataLoader) -> tuple[float, int]:
    """(sum of squared errors, number of ratings) over this worker's shard."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for (users, items), ratings in loader:
            predictions = model(users, items).clamp(0.5, 5.0)  # ratings are 0.5 to 5 stars
            total += F.mse_loss(predictions, ratings, reduction="sum").item()
            count += len(ratings)
    return total, count


def global_rmse(squared_errors: float, count: int, name: str) -> float:
    """The RMSE over every worker's ratings: sum the parts first, take the root last."""
    both = hvd.allreduce(torch.tensor([squared_errors, float(count)], dtype=torch.float64), op=hvd.Sum,
                         name=name)
    return math.sqrt(both[0].item() / both[1].item())


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # one core per worker: several workers share a machine

    workload, train_set, test_set = load_ratings(args)
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    # Evaluation shards must not overlap or pad, or some ratings would count twice.
    test_shard = test_set.select(torch.arange(hvd.rank(), len(test_set), hvd.size()))
    test_loader = DataLoader(test_shard, batch_size=4096)

    model = workload.model(args.arch)  # sized by the users and movies datasets() found
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # The baseline: always predict the mean training rating.
    mean_rating = train_set.targets.mean()
    baseline = global_rmse(F.mse_loss(mean_rating.expand(len(test_shard)), test_shard.targets,
                                      reduction="sum").item(), len(test_shard), "baseline_sse")
    if hvd.rank() == 0:
        print(f"{hvd.size()} workers, {len(train_set)} training and {len(test_set)} test ratings, "
              f"{workload.num_users} users, {workload.num_items} movies, model {args.arch}", flush=True)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        squared_errors, count = 0.0, 0
        for (users, items), ratings in train_loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(users, items), ratings)
            loss.backward()
            optimizer.step()
            squared_errors += loss.item() * len(ratings)
            count += len(ratings)
        train_rmse = global_rmse(squared_errors, count, "train_sse")
        test_rmse = global_rmse(*squared_error_sum(model, test_loader), "test_sse")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train RMSE {train_rmse:.4f}, test RMSE {test_rmse:.4f}", flush=True)

    if hvd.rank() == 0:
        print(f"test RMSE {test_rmse:.4f}, global-mean baseline {baseline:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
