#!/usr/bin/env python3
"""One table of `xmoe generate --measure-bandwidth` over checkpoints of one model in several weight formats.

Usage: python3 tools/bench_quant_formats.py --xmoe build/xmoe --threads 2 --decode 32 --prompt 512 \
           bf16=/tmp/bf16-8l fp8-block=/tmp/fp8-8l [...]

Each checkpoint runs twice at batch 1 in one invocation: a 512-token prompt (prefill tok/s) followed by greedy
decode steps (decode tok/s, weight bytes read per token, share of the read bandwidth the same run probed).
The first format is the baseline of the two ratios: decode tok/s over the baseline's, and the baseline's bytes
per token over this format's (what the decode speed would gain if it were purely bandwidth-bound). Standard
library only (CI has no virtualenv).
"""
import argparse
import re
import subprocess
import sys

PATTERNS = {
    "prefill": r"prefill: \d+ tokens in [\d.]+ s = ([\d.]+) tokens/s",
    "decode": r"decode: \d+ tokens in [\d.]+ s = ([\d.]+) tokens/s",
    "mb": r"weights read per decoded token: ([\d.]+) MB",
    "share": r"= ([\d.]+) % of the measured read bandwidth ([\d.]+) GB/s",
    "load": r"load: ([\d.]+) s for ([\d.]+) GB of checkpoint; resident after load ([\d.]+) GB",
}


def run(xmoe, directory, threads, prompt_len, decode):
    ids = ",".join(str(100 + (i * 37) % 150000) for i in range(prompt_len))
    cmd = [xmoe, "generate", "--model", directory, "--prompt-ids", ids, "--max-tokens", str(decode), "--ignore-eos",
           "--temperature", "0", "--threads", str(threads), "--measure-bandwidth", "--no-stream"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    row = {}
    for key, pattern in PATTERNS.items():
        m = re.search(pattern, out)
        if not m:
            sys.exit(f"{directory}: no '{key}' figure in the output:\n{out}")
        row[key] = [float(g) for g in m.groups()]
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--xmoe", default="build/xmoe")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("checkpoints", nargs="+", help="format=directory; the first is the baseline")
    a = p.parse_args()
    rows = []
    for spec in a.checkpoints:
        name, directory = spec.split("=", 1)
        rows.append((name, run(a.xmoe, directory, a.threads, a.prompt, a.decode)))
        print(f"{name}: done", file=sys.stderr)
    base = rows[0][1]
    print(f"| format | weights/token MB | decode tok/s | share of read bandwidth | tok/s ratio | bytes ratio "
          f"| prefill {a.prompt} tok/s | load s | RSS after load GB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['mb'][0]:.1f} | {r['decode'][0]:.2f} | {r['share'][0]:.1f} % of {r['share'][1]:.1f} GB/s "
              f"| {r['decode'][0] / base['decode'][0]:.2f} | {base['mb'][0] / r['mb'][0]:.2f} | {r['prefill'][0]:.1f} "
              f"| {r['load'][0]:.2f} | {r['load'][2]:.2f} |")


if __name__ == "__main__":
    main()
