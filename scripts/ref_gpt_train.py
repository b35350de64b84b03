"""PyTorch (Python, eager) reference training step of the same GPT as Syncopate's model/gpt.cpp.

Used by scripts/bench_train.py as the peer in the same run: same architecture (pre-LN, tied head,
padded vocabulary with masked logits, SDPA causal attention, tanh GELU), same batch, same AdamW
hyper-parameters, same thread count. Prints one JSON line per step: {"step", "dt", "loss", "tokens"}
(tokens: the step's tokens over every rank).

Distributed, two ways:
  - NNODES > 1 with NODE_RANK, MASTER_ADDR, MASTER_PORT (bench_train.py's peers): DDP over Gloo on
    CPU, one process per node, every rank printing;
  - under torchrun (TORCHELASTIC_RUN_ID set, WORLD_SIZE > 1): the PyTorch DDP reference of
    scripts/gpu_check.sh, `torchrun --standalone --nproc-per-node=G scripts/ref_gpt_train.py
    --device cuda --precision bf16 ...`: DDP over NCCL, one GPU per process (cuda:LOCAL_RANK), bf16
    autocast; with --device cpu, Gloo. Rank 0 prints; each rank draws its own batch.
With neither, --device cpu (the default) is the single-process CPU run bench_train.py times.
"""
import argparse
import contextlib
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"micro": (257, 64, 2, 2, 64), "tiny": (257, 128, 2, 4, 128), "small": (257, 256, 4, 8, 256),
           "gpt2": (50257, 1024, 12, 12, 768), "gpt2-medium": (50257, 1024, 24, 16, 1024)}


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H = H
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.c_attn, s.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.c_fc, s.m_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.m_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V, T, L, H, C):
        super().__init__()
        s.V, s.P = V, (V + 63) // 64 * 64
        s.wte, s.wpe = nn.Embedding(s.P, C), nn.Embedding(T, C)
        s.h = nn.ModuleList(Block(C, H) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)
        for n, p in s.named_parameters():
            if "ln" in n:
                continue
            if n.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if "proj.weight" in n else 0.02)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.h:
            x = b(x)
        logits = F.linear(s.ln_f(x), s.wte.weight)
        if s.P > s.V:
            logits[..., s.V:] = float("-inf")
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step per rank (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", required=True, help="uint16 token file")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: this rank's GPU (LOCAL_RANK under torchrun, else cuda:0) (default: %(default)s)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: autocast (CUDA only; weights and optimizer stay fp32) (default: %(default)s)")
    for act in ap._actions:  # --help shows every option's default, with or without a help text
        if act.help is None and act.default not in (None, argparse.SUPPRESS):
            act.help = "default: %(default)s"
    a = ap.parse_args()
    if a.precision == "bf16" and a.device != "cuda":
        ap.error("--precision bf16 needs --device cuda")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    V, T, L, H, C = PRESETS[a.preset]
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank, world, local = 0, 1, 0
    device = torch.device("cpu")
    if a.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0")) if torchrun else 0
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    model = GPT(V, T, L, H, C).to(device).train()
    nodes = int(os.environ.get("NNODES", "1"))
    if torchrun:  # PyTorch DDP as torchrun starts it: NCCL between GPUs, Gloo between CPU processes
        import torch.distributed as dist
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo")  # env:// from torchrun
        rank, world = dist.get_rank(), dist.get_world_size()
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if a.device == "cuda" else None)
    elif nodes > 1:  # PyTorch DDP over Gloo, the synchronous reference for ring mode
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                rank=int(os.environ["NODE_RANK"]), world_size=nodes)
        model = torch.nn.parallel.DistributedDataParallel(model)
        world = nodes
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    data = np.memmap(a.data, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(rank if torchrun else 0)
    for step in range(a.steps):
        t0 = time.perf_counter()
        off = rng.integers(0, len(data) - T - 1, a.batch)
        w = torch.from_numpy(np.stack([data[o:o + T + 1].astype(np.int64) for o in off]))
        if device.type == "cuda":
            w = w.pin_memory().to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16) if a.precision == "bf16" else contextlib.nullcontext():
            loss = model(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = loss.item()  # waits for the step (the GPU's queue too)
        if rank == 0:
            print(json.dumps({"step": step + 1, "dt": time.perf_counter() - t0, "loss": value,
                              "tokens": a.batch * T * world}), flush=True)
    if torchrun:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
