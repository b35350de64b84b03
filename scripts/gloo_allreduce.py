"""Reference peer for scripts/bench_allreduce.sh: torch.distributed's Gloo all-reduce (CPU, TCP) on
the same nodes and sizes, printing the same columns. One process per node; reads MASTER_ADDR,
MASTER_PORT, NNODES, NODE_RANK from the environment.

Under torchrun (TORCHELASTIC_RUN_ID set) it is scripts/gpu_check.sh's torch.distributed reference:
`torchrun --standalone --nproc-per-node=G scripts/gloo_allreduce.py --backend nccl --ops
all_reduce,reduce_scatter,all_gather --json FILE` (NCCL: one GPU per process, cuda:LOCAL_RANK).
Sizes are the whole buffer, as nccl-tests counts them (reduce-scatter's input, all-gather's
output); busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for the other two. A table per op
(all-reduce's alone, without a heading, when it is the only one); --json FILE: every row, rank 0.
"""
import argparse
import json
import os
import time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--sizes", default="1048576,4194304,16777216,67108864")
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help="nccl: under torchrun, on GPUs (default: %(default)s)")
ap.add_argument("--ops", default="all_reduce", help="comma-separated: all_reduce, reduce_scatter, all_gather (default: %(default)s)")
ap.add_argument("--json", help="write every row here as JSON (rank 0)")
for act in ap._actions:  # --help shows every option's default, with or without a help text
    if act.help is None and act.default not in (None, argparse.SUPPRESS):
        act.help = "default: %(default)s"
a = ap.parse_args()
ops = a.ops.split(",")
for op in ops:
    if op not in ("all_reduce", "reduce_scatter", "all_gather"):
        ap.error(f"unknown op {op}")

import torch  # noqa: E402  (after the arguments: --help answers without loading torch)
import torch.distributed as dist  # noqa: E402
if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: env:// (its agent's store), one device per process
    dev = torch.device("cpu")
    if a.backend == "nccl":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
else:
    dev = torch.device("cpu")
    rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
    dist.init_process_group(a.backend, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    dist.barrier()


rows = []
for op in ops:
    if rank == 0:
        if len(ops) > 1:
            print(f"## {op} ({a.backend}, {world} ranks)", flush=True)
        print("size_bytes time_us algbw_GBps busbw_GBps", flush=True)
    factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
    for size in map(int, a.sizes.split(",")):
        n = size // 4 // world * world  # whole float32 elements, a multiple of the ranks
        full = torch.ones(n, device=dev)
        part = torch.ones(n // world, device=dev)
        if op == "all_reduce":
            call = lambda: dist.all_reduce(full)  # noqa: E731
        elif op == "reduce_scatter":
            call = lambda: dist.reduce_scatter_tensor(part, full)  # noqa: E731
        else:
            call = lambda: dist.all_gather_into_tensor(full, part)  # noqa: E731
        for _ in range(a.warmup):
            call()
        sync()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            call()
        sync()
        us = (time.perf_counter() - t0) / a.iters * 1e6
        nbytes = n * 4
        alg = nbytes / us / 1e3
        if rank == 0:
            print(f"{nbytes} {us:.1f} {alg:.3f} {alg * factor:.3f}", flush=True)
            rows.append({"op": op, "backend": a.backend, "ranks": world, "size": nbytes, "time_us": us,
                         "algbw": alg, "busbw": alg * factor})
if rank == 0 and a.json:
    with open(a.json, "w") as f:
        json.dump(rows, f, indent=1)
dist.destroy_process_group()
