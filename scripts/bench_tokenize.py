#!/usr/bin/env python3
"""Tokenization throughput: syncopate-data against Hugging Face `tokenizers` on the same JSON
Lines file, the same GPT-2 BPE vocabulary and the same number of threads, in the same run.

  scripts/bench_tokenize.py [--mb 32] [--vocab-size 50257] [--threads 1,2] [--work DIR]

Corpus: documents are the Python standard library's source files (present on every machine),
as JSON Lines. The vocabulary is trained on that corpus with `tokenizers` (GPT-2 size by
default). Both sides do the whole job: read the JSONL, parse each line, tokenize with GPT-2 BPE,
append <|endoftext|>, write the ids to disk. Reports MB/s of input, their ratio, and whether the
two produced the same token ids.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_corpus(path, mb):
    files = sorted(glob.glob(f"/usr/lib/python3.*/**/*.py", recursive=True))
    total = 0
    with open(path, "w", encoding="utf-8") as out:
        for f in files:
            try:
                text = open(f, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            if not text:
                continue
            out.write(json.dumps({"text": text}) + "\n")
            total += len(text.encode())
            if total >= mb * 1e6:
                break
    return total


def hf_run(vocab_dir, jsonl, out_path, threads):
    """Runs in a child so that RAYON_NUM_THREADS takes effect; returns (seconds, tokens)."""
    code = f"""
import json, time, numpy as np
from transformers import GPT2TokenizerFast
tok = GPT2TokenizerFast.from_pretrained({vocab_dir!r}).backend_tokenizer
eod = tok.token_to_id("<|endoftext|>")
t0 = time.perf_counter()
n = 0
with open({jsonl!r}, encoding="utf-8") as f, open({out_path!r}, "wb") as out:
    batch = []
    def flush():
        global n
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            ids = enc.ids + [eod]
            n += len(ids)
            out.write(np.asarray(ids, dtype=np.uint16).tobytes())
        batch.clear()
    for line in f:
        batch.append(json.loads(line)["text"])
        if len(batch) == 256:
            flush()
    flush()
print(time.perf_counter() - t0, n)
"""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    secs, n = r.stdout.strip().split()[-2:]
    return float(secs), int(n)


def ours_run(vocab_dir, jsonl, prefix, threads):
    cmd = [f"{ROOT}/build/bin/syncopate-data", "--input", jsonl, "--output-prefix", prefix,
           "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", f"{vocab_dir}/vocab.json",
           "--merge-file", f"{vocab_dir}/merges.txt", "--append-eod", "--workers", str(threads),
           "--output-format", "flat", "--log-interval", "0"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(r.stdout + r.stderr)
    return secs, r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=32)
    ap.add_argument("--vocab-size", type=int, default=50257)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench_tokenize"))
    for act in ap._actions:  # --help shows every option's default, with or without a help text
        if act.help is None and act.default not in (None, argparse.SUPPRESS):
            act.help = "default: %(default)s"
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    jsonl = os.path.join(a.work, "corpus.jsonl")
    nbytes = build_corpus(jsonl, a.mb)
    vocab_dir = os.path.join(a.work, f"vocab{a.vocab_size}")
    if not os.path.exists(os.path.join(vocab_dir, "merges.txt")):
        from tokenizers import ByteLevelBPETokenizer
        t = ByteLevelBPETokenizer()
        t.train([jsonl], vocab_size=a.vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
        os.makedirs(vocab_dir, exist_ok=True)
        t.save_model(vocab_dir)
    file_mb = os.path.getsize(jsonl) / 1e6
    print(f"corpus: {jsonl} ({file_mb:.1f} MB of JSON Lines, {nbytes / 1e6:.1f} MB of text); "
          f"vocabulary: {a.vocab_size} ids trained on it")
    print(f"{'threads':>7} {'ours_s':>8} {'ours_MB/s':>10} {'hf_s':>8} {'hf_MB/s':>9} {'ratio':>6} same_ids")
    for th in [int(x) for x in a.threads.split(",")]:
        prefix = os.path.join(a.work, f"ours{th}")
        ours_s, _ = ours_run(vocab_dir, jsonl, prefix, th)
        hf_s, hf_tokens = hf_run(vocab_dir, jsonl, os.path.join(a.work, f"hf{th}.bin"), th)
        same = open(prefix + "_text_document.bin", "rb").read() == open(os.path.join(a.work, f"hf{th}.bin"), "rb").read()
        print(f"{th:>7} {ours_s:>8.2f} {file_mb / ours_s:>10.2f} {hf_s:>8.2f} {file_mb / hf_s:>9.2f} "
              f"{hf_s / ours_s:>6.2f} {'yes' if same else 'NO'} ({hf_tokens} tokens)")


if __name__ == "__main__":
    main()
