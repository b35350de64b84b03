#!/usr/bin/env python3
"""Reference for the GPT-2 BPE tests (never downloads anything).

  bpe_reference.py train CORPUS OUTDIR [VOCAB_SIZE]
      trains a byte-level BPE vocabulary on CORPUS with Hugging Face `tokenizers` and writes
      OUTDIR/vocab.json and OUTDIR/merges.txt (with <|endoftext|>), GPT-2's file format.
  bpe_reference.py encode OUTDIR TEXTS.json
      prints, as JSON, GPT2TokenizerFast's ids for each string of the JSON list TEXTS.json, and
      its decoding of each id list.
"""
import json
import os
import sys


def train(corpus, outdir, vocab_size):
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train([corpus], vocab_size=vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    os.makedirs(outdir, exist_ok=True)
    tok.save_model(outdir)


def encode(outdir, texts_path):
    from transformers import GPT2TokenizerFast

    tok = GPT2TokenizerFast.from_pretrained(outdir)  # reads OUTDIR/vocab.json + OUTDIR/merges.txt
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)
    ids = [tok.encode(t) for t in texts]
    decoded = [tok.decode(i) for i in ids]
    json.dump({"ids": ids, "decoded": decoded, "vocab_size": len(tok), "eod": tok.convert_tokens_to_ids("<|endoftext|>")},
              sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1000)
    else:
        encode(sys.argv[2], sys.argv[3])
