#!/usr/bin/env python3
"""Serving benchmark: what HTTP serving costs against the engine itself, at 1, 4 and 16 concurrent streams.

In one run, on one machine, for each N in --streams:
- the engine alone: `xmoe generate --batch N` (the same prompt ids, --max-tokens, --ignore-eos, greedy); its own
  decode tokens/s (aggregate over the N sequences) is the baseline;
- the server: one `xmoe serve --max-batch max(N)` and N concurrent streamed POST /v1/completions with the same
  token-id prompt, max_tokens, ignore_eos and temperature 0.

The same work on both sides (N prompts prefilled, N x max_tokens generated), so the main figure is aggregate
throughput: generated tokens over the wall time from submitting to the last token (generate: its engine run;
serve: first request sent to last stream ended, HTTP included), and the ratio serve/generate (goal >= 0.95, i.e.
HTTP serving costs <= 5 %). Beside it, decode rates: the engine's own decode tokens/s (generate's step timing) and
the server's at the client, counted while all N streams are running (text events between the last stream's first
token and the first stream's end; each event is one token unless UTF-8 bytes were held back). TTFT is from
sending to the first token. Scaling: aggregate throughput at max(N) streams over one stream (goal >= 4x).
Both inherit this process's environment (unless it sets OMP_WAIT_POLICY or GOMP_SPINCOUNT, xmoe's bounded spin,
which keeps OpenMP's spinning from costing time slices on a machine shared with other work). Only one copy of the model is in memory at a time: every generate run ends before the server starts, and the
server stops before the next generate run.
  python tools/bench_serve.py --model /tmp/q3-8l --threads 2
"""

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import httpx


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--xmoe", default="./build/xmoe")
    p.add_argument("--model", required=True, help="checkpoint directory (e.g. from xmoe init-model)")
    p.add_argument("--streams", default="1,4,16")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt token ids 1..P")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="OpenMP threads for both (0: default)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each measurement; the median is reported")
    p.add_argument("--json", default=None, help="also write the results to this file")
    return p.parse_args(argv)


def prompt_ids(args):
    return list(range(1, args.prompt_len + 1))


def run_generate(args, n):
    command = [args.xmoe, "generate", "--model", args.model, "--prompt-ids", ",".join(map(str, prompt_ids(args))),
               "--max-tokens", str(args.max_tokens), "--ignore-eos", "--temperature", "0", "--batch", str(n),
               "--no-stream"]
    if args.threads:
        command += ["--threads", str(args.threads)]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    decode = re.search(r"decode: (\d+) tokens.*?([\d.]+) s = ([\d.]+) tokens/s", run.stderr)
    total = re.search(r"(\d+) tokens generated in all in ([\d.]+) s", run.stderr)
    if not decode or not total:
        raise RuntimeError(f"unexpected xmoe generate output:\n{run.stderr}")
    return {"decode_tps": float(decode.group(3)), "tokens": int(total.group(1)), "wall_s": float(total.group(2))}


class Server:
    def __init__(self, args, max_batch):
        command = [args.xmoe, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
                   "--max-batch", str(max_batch)]
        if args.threads:
            command += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.base_url = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"xmoe serve exited with {self.proc.wait()} before listening")
            found = re.search(r"(http://[\w.\[\]:]+:\d+)", line)
            if found and "listening" in line.lower():
                self.base_url = found.group(1)
                break
        if self.base_url is None:
            raise RuntimeError("xmoe serve did not print its URL")

    def close(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def one_stream(client, args, model):
    body = {"model": model, "prompt": prompt_ids(args), "max_tokens": args.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    usage, times = None, []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any(c.get("text") for c in chunk.get("choices") or []):
                times.append(time.monotonic())
    if usage is None or not times:
        raise RuntimeError("a stream without text or usage")
    return {"sent": sent, "first": times[0], "end": times[-1], "times": times, "tokens": usage["completion_tokens"]}


async def serve_round(base_url, args, n):
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(600.0)) as client:
        model = (await client.get("/v1/models")).raise_for_status().json()["data"][0]["id"]
        streams = await asyncio.gather(*(one_stream(client, args, model) for _ in range(n)))
    # The window where all N streams are generating: after the last first token, up to the first stream's end.
    start, stop = max(s["first"] for s in streams), min(s["end"] for s in streams)
    events = sum(sum(1 for t in s["times"] if start < t <= stop) for s in streams)
    return {"decode_tps": events / (stop - start) if stop > start else float("nan"),
            "tokens": sum(s["tokens"] for s in streams),
            "wall_s": max(s["end"] for s in streams) - min(s["sent"] for s in streams),
            "ttft_s": statistics.median(s["first"] - s["sent"] for s in streams),
            "ttft_max_s": max(s["first"] - s["sent"] for s in streams)}


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


def main(argv=None):
    args = parse_args(argv)
    counts = [int(n) for n in args.streams.split(",")]
    results = {n: {"generate": [], "serve": []} for n in counts}
    # The machine's load drifts: each N's two measurements run back to back (generate, then a fresh server with
    # one warm-up request), so both see the same conditions.
    for _ in range(args.repeats):
        for n in counts:
            results[n]["generate"].append(run_generate(args, n))
            print(f"generate --batch {n}: {results[n]['generate'][-1]}", file=sys.stderr)
            server = Server(args, max(counts))
            try:
                asyncio.run(serve_round(server.base_url, args, 1))  # warm-up: threads, first allocations
                results[n]["serve"].append(asyncio.run(serve_round(server.base_url, args, n)))
            finally:
                server.close()
            print(f"serve, {n} streams: {results[n]['serve'][-1]}", file=sys.stderr)

    print(f"model {args.model}; prompt {args.prompt_len} tokens, {args.max_tokens} generated per stream, greedy, "
          f"ignore_eos; threads {args.threads or os.cpu_count()}; OMP_WAIT_POLICY "
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}; median of {args.repeats}")
    print("| streams | generate tok/s | serve tok/s | serve / generate | generate decode tok/s |"
          " serve decode tok/s | TTFT p50 | TTFT max |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = {}
    for n in counts:
        gen, srv = results[n]["generate"], results[n]["serve"]
        row = {"generate_tps": statistics.median(r["tokens"] / r["wall_s"] for r in gen),
               "serve_tps": statistics.median(r["tokens"] / r["wall_s"] for r in srv),
               "generate_decode_tps": median_of(gen, "decode_tps"), "serve_decode_tps": median_of(srv, "decode_tps"),
               "ttft_s": median_of(srv, "ttft_s"), "ttft_max_s": median_of(srv, "ttft_max_s")}
        row["ratio"] = row["serve_tps"] / row["generate_tps"]
        table[n] = row
        print(f"| {n} | {row['generate_tps']:.2f} | {row['serve_tps']:.2f} | {row['ratio']:.3f} | "
              f"{row['generate_decode_tps']:.2f} | {row['serve_decode_tps']:.2f} | "
              f"{1000 * row['ttft_s']:.0f} ms | {1000 * row['ttft_max_s']:.0f} ms |")
    lo, hi = min(counts), max(counts)
    scaling = table[hi]["serve_tps"] / table[lo]["serve_tps"]
    engine_scaling = table[hi]["generate_tps"] / table[lo]["generate_tps"]
    worst = min(row["ratio"] for row in table.values())
    print(f"HTTP serving keeps {100 * worst:.1f} % of the engine's throughput at worst "
          f"(goal >= 95 %): {'met' if worst >= 0.95 else 'NOT met'}")
    print(f"{hi} streams / {lo} stream: serve {scaling:.2f}x, engine alone {engine_scaling:.2f}x "
          f"(goal >= 4x): {'met' if scaling >= 4 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "table": table, "raw": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
