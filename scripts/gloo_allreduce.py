"""Reference peer for scripts/bench_allreduce.sh: torch.distributed's Gloo all-reduce (CPU, TCP) on
the same nodes and sizes, printing the same columns. One process per node; reads MASTER_ADDR,
MASTER_PORT, NNODES, NODE_RANK from the environment."""
import argparse
import os
import time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--sizes", default="1048576,4194304,16777216,67108864")
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
for act in ap._actions:  # --help shows every option's default, with or without a help text
    if act.help is None and act.default not in (None, argparse.SUPPRESS):
        act.help = "default: %(default)s"
a = ap.parse_args()

import torch  # noqa: E402  (after the arguments: --help answers without loading torch)
import torch.distributed as dist  # noqa: E402
rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=rank, world_size=world)
if rank == 0:
    print("size_bytes time_us algbw_GBps busbw_GBps", flush=True)
for size in map(int, a.sizes.split(",")):
    t = torch.ones(size // 4)
    for _ in range(a.warmup):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        dist.all_reduce(t)
    dist.barrier()
    us = (time.perf_counter() - t0) / a.iters * 1e6
    alg = size / us / 1e3
    if rank == 0:
        print(f"{size} {us:.1f} {alg:.3f} {alg * 2 * (world - 1) / world:.3f}", flush=True)
dist.destroy_process_group()
