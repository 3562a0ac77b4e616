"""Training throughput on fake data: Horovod's ``pytorch_synthetic_benchmark.py``, on ringtrain.

Every worker trains one of ringtrain's models on one fixed random batch, so the numbers measure
compute plus gradient exchange and nothing else (no data loading). Warm-up batches are run and not
timed; then ``--num-iters`` timed rounds of ``--num-batches-per-iter`` steps each give images per second
per device, reported as mean +- 1.96 standard deviations, and in total for all workers.

    ringtrain run -np 2 python examples/synthetic_benchmark.py --model resnet18 --fp16-allreduce
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/synthetic_benchmark.py

Every worker also reports its timed rounds to ``ringtrain bench`` (``ringtrain.bench.report``), so a
scaling table over process counts is one command (docs/bench.md):

    ringtrain bench --np 1,2 -- python examples/synthetic_benchmark.py --model mnist-cnn
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import ringtrain as hvd
import ringtrain.bench
from ringtrain.workloads import get_workload

#: --model name -> (workload, architecture, input shape, classes)
MODELS = {
    "resnet18": ("cifar10", "resnet18", (3, 32, 32), 10),
    "mnist-cnn": ("mnist", "cnn", (1, 28, 28), 10),
    "horovod-mnist": ("mnist", "horovod", (1, 28, 28), 10),
    "small-cnn": ("synthetic", "cnn", (3, 32, 32), 10),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ringtrain synthetic benchmark")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size on each worker")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="batches run before timing")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per timed round")
    parser.add_argument("--num-iters", type=int, default=10, help="timed rounds")
    parser.add_argument("--no-cuda", action="store_true")
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)  # one core per worker: workers share the machine's cores
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
    device = torch.device("cuda" if args.cuda else "cpu")

    workload_name, arch, shape, classes = MODELS[args.model]
    model = get_workload(workload_name).model(arch).to(device)
    # The rate does not matter for speed; scale it by the workers anyway, as a real run would.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, *shape, device=device)
    target = torch.randint(classes, (args.batch_size,), device=device)

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if args.cuda:
            torch.cuda.synchronize()  # time the GPU's work, not just its queueing

    def log(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    device_name = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device_name}s: {hvd.size()}")

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    timed_seconds = 0.0
    for x in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        timed_seconds += seconds
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {device_name}")
        img_secs.append(img_sec)

    # the line `ringtrain bench` reads: this worker's images and seconds, warm-up left out, and a hash
    # of its parameters (the sweep fails a run whose workers ended with different models)
    steps = args.num_iters * args.num_batches_per_iter
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    digest = ringtrain.bench.parameters_digest(model)
    ringtrain.bench.report(items=args.batch_size * steps, seconds=timed_seconds, steps=steps,
                           gradient_bytes=gradient_bytes, parameters_digest=digest)

    # Rank 0's rounds stand for every worker: the allreduce in each step keeps them in lockstep.
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per {device_name}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device_name}(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
