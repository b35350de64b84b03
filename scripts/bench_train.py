"""Training throughput and peak memory: Syncopate (C++) vs the PyTorch eager reference, same run.

  python scripts/bench_train.py [--presets tiny,small] [--steps 30] [--batch 16] [--threads 2] [--rounds 3]

Both programs train the same architecture with the same batch, AdamW and thread count on the same
token file; they alternate, `rounds` times each, so machine noise hits both. Reported: median
tokens/s over steps after the first 5 (warm-up), peak resident memory (ru_maxrss of the process),
and the ratios Syncopate / PyTorch.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET_T = {"tiny": 128, "small": 256, "gpt2": 1024, "gpt2-medium": 1024}


def run(cmd, env=None):
    """Runs cmd, returns (stdout, peak RSS in MB)."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        out.seek(0)
        text = out.read().decode()
        if status != 0:
            sys.exit(f"command failed: {' '.join(cmd)}\n{text}")
        return text, ru.ru_maxrss / 1024.0


def median_tok_s(dts, tokens_per_step):
    steady = dts[5:] if len(dts) > 8 else dts
    return tokens_per_step / statistics.median(steady)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    for act in ap._actions:  # --help shows every option's default, with or without a help text
        if act.help is None and act.default not in (None, argparse.SUPPRESS):
            act.help = "default: %(default)s"
    a = ap.parse_args()
    worker = os.path.join(ROOT, "build/bin/syncopate-worker")
    py = os.path.join(ROOT, ".venv/bin/python")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets.split(","):
            T = PRESET_T[preset]
            tps = a.batch * T
            ours, ref, ours_mem, ref_mem = [], [], [], []
            for r in range(a.rounds):
                out = os.path.join(tmp, f"{preset}-{r}")
                _, mem = run([worker, "--out", out, f"--model.preset={preset}", f"--train.steps={a.steps}",
                              f"--train.batch_size={a.batch}", f"--train.threads={a.threads}", "--eval.every=0",
                              "--eval.sample_tokens=0", "--eval.batches=1", f"--data.cache_dir={ROOT}/data/cache",
                              "--train.device=cpu"])
                dts = []
                with open(os.path.join(out, "metrics.jsonl")) as f:
                    for line in f:
                        m = json.loads(line)
                        if "tokens_per_s" in m:
                            dts.append(tps / m["tokens_per_s"])
                ours.append(median_tok_s(dts, tps))
                ours_mem.append(mem)
                data = sorted(glob.glob(f"{ROOT}/data/cache/byte-*/*_text_document.bin"))[0]
                text, mem = run([py, os.path.join(ROOT, "scripts/ref_gpt_train.py"), "--preset", preset,
                                 "--batch", str(a.batch), "--steps", str(a.steps), "--threads", str(a.threads),
                                 "--data", data])
                dts = [json.loads(l)["dt"] for l in text.splitlines() if l.startswith("{")]
                ref.append(median_tok_s(dts, tps))
                ref_mem.append(mem)
            o, p = statistics.median(ours), statistics.median(ref)
            om, pm = max(ours_mem), max(ref_mem)
            rows.append((preset, a.batch, T, a.threads, o, p, o / p, om, pm, om / pm))
    print("| preset | batch | context | threads | Syncopate tok/s | PyTorch tok/s | ratio | Syncopate peak MB | PyTorch peak MB | mem ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| {} | {} | {} | {} | {:.0f} | {:.0f} | {:.2f} | {:.0f} | {:.0f} | {:.2f} |".format(*r))


if __name__ == "__main__":
    main()
