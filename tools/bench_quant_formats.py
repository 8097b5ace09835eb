#!/usr/bin/env python3
"""One table of `xmoe generate --measure-bandwidth` over checkpoints of one model in several weight formats.

One command, checkpoints written as needed (init-model, same seed, in each format) and benchmarked:
    python3 tools/bench_quant_formats.py --xmoe build/xmoe \
        --config configs/qwen3-30b-a3b-8layers.json --workdir /tmp/q3-8l --repeats 3
or over checkpoints that exist already (the first is the baseline):
    python3 tools/bench_quant_formats.py bf16=/tmp/bf16-8l fp8-block=/tmp/fp8-8l [...]

Each run is one `xmoe generate` at batch 1: a --prompt-token prompt (prefill tok/s) followed by --decode greedy
steps (decode tok/s, weight bytes read per token, share of the read bandwidth probed in the same run, load time
and resident memory after load). Every repeat runs every checkpoint in turn (so that the machine's drift hits
all alike), each checkpoint's files read right before its runs (a cold page cache would time the disk, not the
kernels); each figure is the median over --repeats runs, and each run's share is printed too, marked where its
threads waited for a CPU (another process on the machine; generate's run-queue report) more than --max-wait %. The first format is
the baseline of the ratios: decode tok/s over the baseline's, the baseline's bytes per token over this format's
(what decode would gain if it were purely bandwidth-bound; the goal is a tok/s ratio ≥ 0.9 × the bytes ratio),
and prefill tok/s over the baseline's. Prints the CPU and the load average before and after. Standard library
only (CI has no virtualenv).

A shared host's read bandwidth moves between levels within seconds (29-33 GB/s, then 44-46, on a 2-vCPU Zen 4
VM), so probes before and after a run misjudge it, and formats run minutes apart meet different machines.
generate also probes between decode steps (128 MiB, a few ms each, not timed as decode): each run's share of
the roofline at the probes beside its steps is in its own column, and the ratio of two formats' such shares
is their tok/s ratio / bytes ratio with the drift taken out. The runs whose probes between steps stayed within
25 % of each other (one host state throughout) are listed with that share and their probes' median GB/s.

--precision medium runs the linears at `--matmul-precision medium` (bf16 products; AVX512-BF16). --variants
compares builds and precisions in the same run, e.g. `--variants base=/tmp/main/xmoe:highest,highest,medium`
(NAME=XMOE:PRECISION, XMOE and PRECISION optional): every checkpoint is run by each variant in turn, repeat by
repeat (A/B alternated while its files are in the page cache), and gets one row per variant.

With --profile, each format also gets `xmoe linear-bench --model DIR` (the same threads): one batch-1 decode
step's weight-reading ops per class (attention projections, router, routed experts, lm_head) over the
checkpoint's mapped weights, time, bytes and GB/s against that run's read probe, and the rest of a decoded
token (attention over the cache, norms, routing, sampler, engine) as the generate run's time per token minus
the weight ops' time.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

PATTERNS = {
    "prefill": r"prefill: \d+ tokens in [\d.]+ s = ([\d.]+) tokens/s",
    "decode": r"decode: \d+ tokens in [\d.]+ s = ([\d.]+) tokens/s",
    "mb": r"weights read per decoded token: ([\d.]+) MB",
    "share": r"= ([\d.]+) % of the measured read bandwidth ([\d.]+) GB/s",
    "probes": r"\(probed ([\d.]+) before, ([\d.]+) after",
    "load": r"load: ([\d.]+) s for ([\d.]+) GB of checkpoint; resident after load ([\d.]+) GB \(([\d.]+) GB anonymous, "
            r"([\d.]+) GB mapped file pages\)",
}
# The share of its threads' time the run spent waiting for a CPU (another process on the machine).
WAIT = r"threads waited for a CPU [\d.]+ ms in the run \(([\d.]+) % of"
# Decode against the read probe run between its steps (the share of the roofline at those probes, Σ over the
# steps, and the steps' median share); builds before it print none.
BETWEEN = r"\): ([\d.]+) % of the roofline at the probes beside each step \(per step: median ([\d.]+) %"
# The range and median of those probes (GB/s): a run whose probes stayed within STEADY of each other met one
# host state throughout.
BETWEEN_PROBES = r"probes ([\d.]+)-([\d.]+) GB/s, median ([\d.]+)\): [\d.]+ % of the roofline at the probes beside"
STEADY = 1.25
FORMATS = ("bf16", "fp8-block", "mxfp4", "nvfp4")
PROFILE_ROW = re.compile(r"^(.+?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$")
PROFILE_PROBE = re.compile(r"read probe: ([\d.]+) GB/s anonymous buffer.*?; ([\d.]+) GB/s over the mapped lm_head")


def write_checkpoints(xmoe, config, workdir, seed):
    """format=directory specs for every format, writing those not there yet."""
    specs = []
    for fmt in FORMATS:
        directory = os.path.join(workdir, fmt)
        if not os.path.exists(os.path.join(directory, "config.json")):
            cmd = [xmoe, "init-model", "--config", config, "--out", directory, "--seed", str(seed)]
            if fmt != "bf16":
                cmd += ["--quant", fmt]
            print(f"writing {directory}", file=sys.stderr)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        specs.append(f"{fmt}={directory}")
    return specs


def warm_page_cache(directory):
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            with open(os.path.join(directory, name), "rb") as f:
                while f.read(64 << 20):
                    pass


def run(xmoe, directory, threads, prompt_len, decode, precision, isa=None):
    with open(os.path.join(directory, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ids = ",".join(str((100 + i * 37) % vocab) for i in range(prompt_len))
    cmd = [xmoe, "generate", "--model", directory, "--prompt-ids", ids, "--max-tokens", str(decode), "--ignore-eos",
           "--temperature", "0", "--threads", str(threads), "--measure-bandwidth", "--no-stream",
           # pages the weights in first: without it prefill times first-touch page faults of the mapping
           "--warmup"]
    if precision != "highest":  # older builds lack the option
        cmd += ["--matmul-precision", precision]
    if isa:
        cmd += ["--isa", isa]
    # The caller's environment: unless it sets OMP_WAIT_POLICY or GOMP_SPINCOUNT, xmoe's own bounded spin (see
    # `xmoe info`), which a loaded machine costs little and a sleeping worker's wake-up (tens of us a parallel
    # region on a virtual machine) does not slow.
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    row = {}
    for key, pattern in PATTERNS.items():
        m = re.search(pattern, out)
        if not m:
            sys.exit(f"{directory}: no '{key}' figure in the output:\n{out}")
        row[key] = [float(g) for g in m.groups()]
    # Builds before the run-queue report (the baseline) print none: unknown, not zero.
    m = re.search(WAIT, out)
    row["wait"] = [float(m.group(1)) if m else float("nan")]
    m = re.search(BETWEEN, out)
    row["between"] = [float(m.group(1)), float(m.group(2))] if m else [float("nan")] * 2
    m = re.search(BETWEEN_PROBES, out)
    row["between_probes"] = [float(g) for g in m.groups()] if m else [float("nan")] * 3
    return row


def profile(xmoe, directory, threads, steps, precision, isa=None):
    """{op class: (ms/step, MB/step, GB/s, % of probe)} and (anonymous, mapped) probe GB/s of one profile run."""
    cmd = [xmoe, "linear-bench", "--model", directory, "--threads", str(threads), "--reps", str(steps)]
    if precision != "highest":
        cmd += ["--matmul-precision", precision]
    if isa:
        cmd += ["--isa", isa]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        m = PROFILE_ROW.match(line.strip())
        if m:
            rows[m.group(1).strip()] = tuple(float(m.group(i)) for i in range(2, 6))
    probe = PROFILE_PROBE.search(out)
    if not rows or not probe:
        sys.exit(f"{directory}: no profile in the output of linear-bench --model:\n{out}")
    return rows, (float(probe.group(1)), float(probe.group(2)))


def median_row(runs):
    return {key: [statistics.median(r[key][i] for r in runs) for i in range(len(runs[0][key]))] for key in runs[0]}


def run_shares(runs, max_wait):
    """Each run's share of the bandwidth probed around it, in run order; * marks a run whose threads waited
    for a CPU more than max_wait % of the time (its share says more about the other process than the kernels)."""
    return " ".join(f"{r['share'][0]:.0f}{'*' if r['wait'][0] > max_wait else ''}" for r in runs)


def steady_runs(runs):
    """The runs that met one host state throughout (their probes between steps within STEADY of each other):
    each one's share at those probes and their median GB/s, in run order. Medians over all runs mix runs that
    met a ~33 GB/s host with ones that met a ~60 GB/s one; these say what each state allows."""
    steady = [r for r in runs if r["between_probes"][1] <= STEADY * r["between_probes"][0]]
    return "; ".join(f"{r['between'][0]:.1f} % at {r['between_probes'][2]:.1f} GB/s" for r in steady) or "none"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--xmoe", default="build/xmoe")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="runs per format; figures are medians")
    p.add_argument("--config", help="write the checkpoints of this config.json (with --workdir)")
    p.add_argument("--workdir", help="where --config's checkpoints are written (reused when present)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="also the per-op breakdown of a decode step")
    p.add_argument("--profile-steps", type=int, default=9, help="timed decode steps of each profile")
    p.add_argument("--precision", choices=("highest", "medium"), default="highest",
                   help="--matmul-precision of every run (default of --variants)")
    p.add_argument("--variants", help="NAME=XMOE:PRECISION,... builds / precisions run in turn on every checkpoint")
    p.add_argument("--isa", help="kernel level (avx2, avx512, ...; default: the CPU's best), e.g. an AVX2-only "
                                 "CPU's kernels on a newer one")
    p.add_argument("--max-wait", type=float, default=5.0,
                   help="flag runs whose threads waited for a CPU more than this %% of the time")
    p.add_argument("checkpoints", nargs="*", help="format=directory; the first is the baseline")
    a = p.parse_args()
    variants = []  # (name, xmoe, precision)
    for v in (a.variants.split(",") if a.variants else [""]):
        name, _, rest = v.rpartition("=") if "=" in v else ("", "", v)
        xmoe, _, precision = rest.rpartition(":") if ":" in rest else ("", "", rest)
        precision = precision or a.precision
        if precision not in ("highest", "medium"):
            sys.exit(f"--variants: unknown precision '{precision}' in '{v}'")
        variants.append((name or precision, xmoe or a.xmoe, precision))
    specs = list(a.checkpoints)
    if a.config:
        if not a.workdir:
            sys.exit("--config needs --workdir")
        specs = write_checkpoints(a.xmoe, a.config, a.workdir, a.seed) + specs
    if not specs:
        sys.exit("give --config and --workdir, or format=directory checkpoints")
    info = subprocess.run([a.xmoe, "info"], capture_output=True, text=True).stdout.splitlines()
    load_before = os.getloadavg()
    rows = []
    profiles = {}
    # The machine's bandwidth drifts over minutes and other processes come and go: every repeat runs every
    # checkpoint (and on it every variant in turn), so that drift hits all formats alike rather than the ones
    # benchmarked last. All checkpoints together may not fit in the page cache: each is read in again right
    # before its runs (cheap when its pages are still there).
    runs = {(spec, v): [] for spec in specs for v in variants}
    for rep in range(a.repeats):
        for spec in specs:
            fmt, directory = spec.split("=", 1)
            warm_page_cache(directory)
            for v in variants:
                r = run(v[1], directory, a.threads, a.prompt, a.decode, v[2], a.isa)
                runs[(spec, v)].append(r)
                print(f"repeat {rep + 1}/{a.repeats} {fmt} {v[0]}: {r['decode'][0]:.2f} decode tok/s, "
                      f"{r['share'][0]:.1f} % of {r['share'][1]:.2f} GB/s (probed {r['probes'][0]:.2f} before, "
                      f"{r['probes'][1]:.2f} after; {r['between'][0]:.1f} % against the probes between steps), threads waited for a CPU {r['wait'][0]:.1f} % of the run",
                      file=sys.stderr)
    for spec in specs:
        fmt, directory = spec.split("=", 1)
        for v in variants:
            name = fmt if len(variants) == 1 else f"{fmt} {v[0]}"
            rows.append((name, median_row(runs[(spec, v)]), run_shares(runs[(spec, v)], a.max_wait),
                         steady_runs(runs[(spec, v)])))
            if a.profile:
                profiles[name] = profile(v[1], directory, a.threads, a.profile_steps, v[2], a.isa)
    load_after = os.getloadavg()
    wait = next((l.split(":", 1)[1].strip() for l in info if l.startswith("openmp wait:")),
                os.environ.get("OMP_WAIT_POLICY", "unknown"))
    base = rows[0][1]
    print(f"{info[0] if info else ''}; kernel level {a.isa or 'best'}; {a.threads} threads, batch 1, medians of {a.repeats} runs, OpenMP wait "
          f"{wait}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"| format | weights/token MB | decode tok/s | share of read bandwidth | shares per run % "
          f"| share of the probes between steps (per-step median) "
          f"| runs in one host state: share at the probes between steps "
          f"| tok/s ratio | bytes ratio | tok/s ratio / bytes ratio | the same at the probes between steps "
          f"| prefill {a.prompt} tok/s | prefill ratio "
          f"| load s | RSS after load GB (anonymous + mapped file) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r, shares, steady in rows:
        tok_ratio = r["decode"][0] / base["decode"][0]
        bytes_ratio = base["mb"][0] / r["mb"][0]
        # tok/s ratio / bytes ratio is this format's weight GB/s over the baseline's; with each run's GB/s taken
        # against the probes beside its own steps, it is the ratio of the two shares.
        print(f"| {name} | {r['mb'][0]:.1f} | {r['decode'][0]:.2f} | {r['share'][0]:.1f} % of {r['share'][1]:.1f} GB/s "
              f"| {shares} | {r['between'][0]:.1f} % ({r['between'][1]:.1f} %) | {steady} "
              f"| {tok_ratio:.2f} | {bytes_ratio:.2f} | {tok_ratio / bytes_ratio:.2f} "
              f"| {r['between'][0] / base['between'][0]:.2f} | {r['prefill'][0]:.1f} "
              f"| {r['prefill'][0] / base['prefill'][0]:.2f} | {r['load'][0]:.2f} "
              f"| {r['load'][2]:.2f} ({r['load'][3]:.2f} + {r['load'][4]:.2f}) |")

    print(f"(shares per run in run order; * = its threads waited for a CPU more than {a.max_wait:g} % of the run: "
          f"another process had the cores)")
    for name, r, _, _ in rows:
        if name not in profiles:
            continue
        classes, (anon, mapped) = profiles[name]
        token_ms = 1000.0 / r["decode"][0]
        step = next((v for k, v in classes.items() if k.startswith("step")), None)
        print(f"\n{name}: one decode step's weight ops (linear-bench --model, {a.threads} threads; read probe "
              f"{anon:.2f} GB/s anonymous, {mapped:.2f} GB/s over the mapped lm_head)")
        print("| op class | ms/token | MB/token | GB/s | of probe |")
        print("|---|---|---|---|---|")
        for k, (ms, mb, gbs, share) in classes.items():
            print(f"| {k} | {ms:.2f} | {mb:.1f} | {gbs:.2f} | {share:.1f} % |")
        if step:
            print(f"| rest of a token (generate's {token_ms:.2f} ms/token - weight ops) | {token_ms - step[0]:.2f} | "
                  f"| | |")


if __name__ == "__main__":
    main()
