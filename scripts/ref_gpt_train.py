"""PyTorch (Python, eager) reference training step of the same GPT as Syncopate's model/gpt.cpp.

Used by scripts/bench_train.py as the peer in the same run: same architecture (pre-LN, tied head,
padded vocabulary with masked logits, SDPA causal attention, tanh GELU), same batch, same AdamW
hyper-parameters, same thread count. Prints one JSON line per step: {"step", "dt"}.
"""
import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"tiny": (257, 128, 2, 4, 128), "small": (257, 256, 4, 8, 256),
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
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.h:
            x = b(x)
        logits = F.linear(s.ln_f(x), s.wte.weight)
        if s.P > s.V:
            logits[..., s.V:] = float("-inf")
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", required=True, help="uint16 token file")
    for act in ap._actions:  # --help shows every option's default, with or without a help text
        if act.help is None and act.default not in (None, argparse.SUPPRESS):
            act.help = "default: %(default)s"
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    V, T, L, H, C = PRESETS[a.preset]
    model = GPT(V, T, L, H, C).train()
    world = int(os.environ.get("NNODES", "1"))
    if world > 1:  # PyTorch DDP over Gloo, the synchronous reference for ring mode
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                rank=int(os.environ["NODE_RANK"]), world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    data = np.memmap(a.data, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(0)
    for step in range(a.steps):
        t0 = time.perf_counter()
        off = rng.integers(0, len(data) - T - 1, a.batch)
        w = torch.from_numpy(np.stack([data[o:o + T + 1].astype(np.int64) for o in off]))
        loss = model(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        print(json.dumps({"step": step + 1, "dt": time.perf_counter() - t0, "loss": loss.item()}), flush=True)


if __name__ == "__main__":
    main()
