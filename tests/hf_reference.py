"""Reference side of the Hugging Face interoperability test.

  hf_reference.py make DIR   writes DIR/hf/model.safetensors (GPT2LMHeadModel.save_pretrained, random
                             weights) and DIR/ref.safetensors (input ids, HF logits)
  hf_reference.py check DIR  loads DIR/ours.safetensors (written by Syncopate) into GPT2LMHeadModel and
                             compares its logits with DIR/ours_logits.safetensors; exit 0 if equal
"""
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

CFG = dict(vocab_size=300, n_positions=32, n_embd=64, n_layer=2, n_head=4,
           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
           layer_norm_epsilon=1e-5)


def make(d):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**CFG)).eval()
    with torch.no_grad():  # random LayerNorm parameters too, so that every tensor matters
        for n, p in model.named_parameters():
            if "ln" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(f"{d}/hf", safe_serialization=True)
    ids = torch.randint(0, CFG["vocab_size"], (2, 32))
    with torch.no_grad():
        logits = model(ids).logits
    save_file({"ids": ids, "logits": logits.contiguous()}, f"{d}/ref.safetensors")


def check(d):
    model = GPT2LMHeadModel(GPT2Config(**CFG)).eval()
    state = load_file(f"{d}/ours.safetensors")
    missing, unexpected = model.transformer.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("attn.bias") and not m.endswith("masked_bias")]
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    ref = load_file(f"{d}/ours_logits.safetensors")
    with torch.no_grad():
        logits = model(ref["ids"]).logits
    err = (logits - ref["logits"]).abs().max().item()
    print(f"max abs logit difference: {err:.3g}")
    sys.exit(0 if err < 1e-4 else 1)


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](sys.argv[2])
