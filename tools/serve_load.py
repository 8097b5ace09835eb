#!/usr/bin/env python3
"""Load test of a running `xmoe serve`: N concurrent streaming clients on POST /v1/chat/completions.

Each client sends streamed chat requests back to back until the time or request budget is spent. Every stream is
checked event by event against the OpenAI stream format: one id, the role delta first, then content deltas,
exactly one finish_reason, the usage chunk (choices == []) after it, `[DONE]` last. Each request asks for
logprobs, so every generated token arrives as one logprobs entry: their count must equal usage.completion_tokens
(a lost or duplicated event changes it), and finish_reason "length" means exactly max_tokens tokens.

A share of the requests (--disconnect-share) close their connection after a few deltas; the server must cancel
them: after the run, /metrics must show no running sequence, no queued request and no KV-cache blocks in use.
With --pid, the server's resident memory (VmRSS) is sampled after a warm-up; the median of the first and last
quarter of the samples must agree within --rss-tolerance.

Prints aggregate generated tokens/s and time-to-first-token p50/p99; exits 1 when a check fails.
  python tools/serve_load.py --base-url http://127.0.0.1:8000 --clients 64 --duration 15 --pid "$(pgrep -n xmoe)"
"""

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx

WORDS = ("expert router token batch cache stream layer model gate capacity sparse dense shard rank prefill "
         "decode sample vector matrix kernel memory thread queue server answer question mixture").split()

# Prometheus series whose sum must be zero once the load has stopped.
IDLE_METRICS = ("xmoe_running_sequences", "xmoe_queue_depth", "xmoe_kv_cache_blocks_used")


@dataclass
class Outcome:
    ok: bool = False
    cancelled: bool = False
    error: str = ""
    tokens: int = 0          # generated tokens this client saw (logprobs entries)
    events: int = 0
    ttft: float | None = None
    latency: float = 0.0


@dataclass
class Totals:
    outcomes: list = field(default_factory=list)
    rss_kib: list = field(default_factory=list)     # (time, KiB) after warm-up
    running_peak: float = 0.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000 (no /v1)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="default: the first of GET /v1/models")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=15.0, help="seconds of load after the warm-up")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before RSS sampling starts")
    p.add_argument("--requests", type=int, default=0, help="stop after this many requests (0: time only)")
    p.add_argument("--max-tokens", type=int, nargs=2, default=(8, 48), metavar=("MIN", "MAX"),
                   help="each request draws max_tokens uniformly from [MIN, MAX]")
    p.add_argument("--prompt-words", type=int, nargs=2, default=(4, 40), metavar=("MIN", "MAX"))
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--disconnect-share", type=float, default=0.2,
                   help="share of requests whose client closes the stream after 1-4 deltas")
    p.add_argument("--pid", type=int, default=0, help="server process id, to sample VmRSS")
    p.add_argument("--rss-tolerance", type=float, default=0.05, help="allowed relative RSS growth")
    p.add_argument("--rss-slack-mib", type=float, default=16.0, help="allowed absolute RSS growth")
    p.add_argument("--idle-timeout", type=float, default=10.0,
                   help="seconds to wait for /metrics to show the server idle after the run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the summary as JSON to this file")
    return p.parse_args(argv)


def check_stream(events, max_tokens):
    """Problems with one complete stream (the list of SSE data payloads), and its token count."""
    if not events:
        return ["empty stream"], 0
    if events[-1] != "[DONE]":
        return [f"last event is not [DONE]: {events[-1][:80]!r}"], 0
    if events.count("[DONE]") != 1:
        return ["[DONE] more than once"], 0
    problems, chunks = [], []
    for raw in events[:-1]:
        try:
            chunks.append(json.loads(raw))
        except json.JSONDecodeError:
            return [f"not JSON: {raw[:80]!r}"], 0
    ids = {c.get("id") for c in chunks}
    if len(ids) != 1:
        problems.append(f"{len(ids)} different ids")
    if any(c.get("object") != "chat.completion.chunk" for c in chunks):
        problems.append("a chunk whose object is not chat.completion.chunk")
    usage_chunks = [c for c in chunks if not c.get("choices")]
    choice_chunks = [c for c in chunks if c.get("choices")]
    if len(usage_chunks) != 1 or chunks[-1] is not usage_chunks[0]:
        problems.append(f"{len(usage_chunks)} usage chunks; it must be one, last before [DONE]")
    if not choice_chunks or choice_chunks[0]["choices"][0].get("delta", {}).get("role") != "assistant":
        problems.append("the first delta does not carry role assistant")
    roles = sum(1 for c in choice_chunks if "role" in c["choices"][0].get("delta", {}))
    if roles != 1:
        problems.append(f"role appears in {roles} deltas")
    finishes = [i for i, c in enumerate(choice_chunks) if c["choices"][0].get("finish_reason")]
    if len(finishes) != 1 or finishes[0] != len(choice_chunks) - 1:
        problems.append(f"finish_reason in chunks {finishes} of {len(choice_chunks)}; exactly one, the last")
    if any(c["choices"][0].get("index", 0) != 0 for c in choice_chunks):
        problems.append("a choice index other than 0")
    tokens = sum(len((c["choices"][0].get("logprobs") or {}).get("content") or []) for c in choice_chunks)
    if usage_chunks and usage_chunks[0].get("usage"):
        usage = usage_chunks[0]["usage"]
        if usage.get("completion_tokens") != tokens:
            problems.append(f"usage.completion_tokens {usage.get('completion_tokens')} != {tokens} tokens streamed")
        if usage.get("total_tokens") != usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0):
            problems.append("usage.total_tokens != prompt_tokens + completion_tokens")
    else:
        problems.append("no usage in the final chunk")
    if finishes and choice_chunks[finishes[-1]]["choices"][0]["finish_reason"] == "length" and tokens != max_tokens:
        problems.append(f"finish_reason length after {tokens} tokens, max_tokens {max_tokens}")
    return problems, tokens


async def one_request(client, args, model, rng, deadline):
    max_tokens = rng.randint(*args.max_tokens)
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*args.prompt_words)))
    disconnect_after = rng.randint(1, 4) if rng.random() < args.disconnect_share else 0
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
            "temperature": args.temperature, "seed": rng.randrange(1 << 30), "logprobs": True}
    out = Outcome()
    start = time.monotonic()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body,
                                 timeout=httpx.Timeout(max(30.0, deadline - start + 60.0))) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                out.error = f"HTTP {response.status_code}: {text[:200]}"
                return out
            events, data, deltas = [], [], 0
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                    continue
                if line or not data:
                    continue
                events.append("\n".join(data))
                data = []
                if events[-1] == "[DONE]":
                    continue
                chunk = json.loads(events[-1])
                choice = (chunk.get("choices") or [{}])[0]
                delta = choice.get("delta") or {}
                if out.ttft is None and (delta.get("content") or delta.get("reasoning_content")):
                    out.ttft = time.monotonic() - start
                out.tokens += len((choice.get("logprobs") or {}).get("content") or [])
                if delta.get("content") or delta.get("reasoning_content"):
                    deltas += 1
                if disconnect_after and deltas >= disconnect_after and not choice.get("finish_reason"):
                    out.cancelled = True  # leaving the `async with` closes the connection mid-stream
                    out.events = len(events)
                    return out
            if data:
                events.append("\n".join(data))
            problems, out.tokens = check_stream(events, max_tokens)
            out.events = len(events)
            out.error = "; ".join(problems)
            out.ok = not problems
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        out.error = f"{type(e).__name__}: {e}"
    finally:
        out.latency = time.monotonic() - start
    return out


async def client_loop(client, args, model, rng, deadline, budget, totals):
    while time.monotonic() < deadline and budget.take():
        totals.outcomes.append(await one_request(client, args, model, rng, deadline))


class Budget:
    def __init__(self, limit):
        self.left = limit if limit > 0 else None

    def take(self):
        if self.left is None:
            return True
        if self.left == 0:
            return False
        self.left -= 1
        return True


def read_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def metric_values(text):
    """Sum of each metric family's samples in a Prometheus text body."""
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(3))
    return values


async def sample(client, args, start_rss, stop, totals):
    """RSS (after the warm-up) and the peak of running sequences, every 0.25 s while the load runs."""
    while not stop.is_set():
        now = time.monotonic()
        if args.pid and now >= start_rss:
            totals.rss_kib.append((now, read_rss_kib(args.pid)))
        try:
            values = metric_values((await client.get("/metrics", timeout=5)).text)
            # The server's own high-water mark sees every step; sampling the gauge every 0.25 s can miss the peak.
            totals.running_peak = max(totals.running_peak, values.get("xmoe_running_sequences_peak", 0.0),
                                      values.get("xmoe_running_sequences", 0.0))
        except httpx.HTTPError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except asyncio.TimeoutError:
            pass


def quantile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args):
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.clients + 4, max_keepalive_connections=args.clients + 4)
    async with httpx.AsyncClient(base_url=args.base_url, headers=headers, limits=limits, timeout=30) as client:
        model = args.model
        if model is None:
            listing = (await client.get("/v1/models")).raise_for_status().json()
            model = listing["data"][0]["id"]
        totals, stop, budget = Totals(), asyncio.Event(), Budget(args.requests)
        start = time.monotonic()
        deadline = start + args.warmup + args.duration
        sampler = asyncio.create_task(sample(client, args, start + args.warmup, stop, totals))
        await asyncio.gather(*(client_loop(client, args, model, random.Random(args.seed * 100003 + i), deadline,
                                           budget, totals) for i in range(args.clients)))
        wall = time.monotonic() - start
        stop.set()
        await sampler
        # Cancelled sequences are freed at the engine's next step: wait until the server says it is idle.
        idle, after = False, {}
        idle_deadline = time.monotonic() + args.idle_timeout
        while time.monotonic() < idle_deadline:
            after = metric_values((await client.get("/metrics", timeout=5)).text)
            if all(name in after and after[name] == 0 for name in IDLE_METRICS):
                idle = True
                break
            await asyncio.sleep(0.2)
        if args.pid:
            totals.rss_kib.append((time.monotonic(), read_rss_kib(args.pid)))
    return summarize(args, totals, wall, idle, after)


def summarize(args, totals, wall, idle, after):
    outcomes = totals.outcomes
    failed = [o for o in outcomes if not o.ok and not o.cancelled]
    ttfts = [o.ttft for o in outcomes if o.ttft is not None]
    tokens = sum(o.tokens for o in outcomes)
    summary = {
        "clients": args.clients, "wall_s": round(wall, 2), "requests": len(outcomes),
        "completed": sum(o.ok for o in outcomes), "cancelled": sum(o.cancelled for o in outcomes),
        "failed": len(failed), "failures": sorted({o.error for o in failed})[:10],
        "tokens": tokens, "tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "ttft_p50_ms": round(1000 * quantile(ttfts, 0.50), 1), "ttft_p99_ms": round(1000 * quantile(ttfts, 0.99), 1),
        "running_peak": totals.running_peak, "idle_after": idle,
        "metrics_after": {name: after.get(name) for name in IDLE_METRICS},
    }
    checks = {"no_failed_requests": not failed and bool(outcomes), "server_idle_after_cancellations": idle}
    if args.pid and len(totals.rss_kib) >= 8:
        rss = [kib for _, kib in totals.rss_kib]
        quarter = max(1, len(rss) // 4)
        first, last = statistics.median(rss[:quarter]), statistics.median(rss[-quarter:])
        summary.update(rss_first_quartile_mib=round(first / 1024, 1), rss_last_quartile_mib=round(last / 1024, 1),
                       rss_samples=len(rss), rss_mib=[round(kib / 1024, 1) for kib in rss])
        checks["rss_flat"] = last <= first * (1 + args.rss_tolerance) + args.rss_slack_mib * 1024
    elif args.pid:
        checks["rss_flat"] = False
        summary["rss_samples"] = len(totals.rss_kib)
    summary["checks"] = checks
    summary["passed"] = all(checks.values())
    return summary


def main(argv=None):
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    print(f"{summary['clients']} clients, {summary['wall_s']} s: {summary['requests']} requests "
          f"({summary['completed']} complete, {summary['cancelled']} disconnected mid-stream, "
          f"{summary['failed']} failed)")
    print(f"generated {summary['tokens']} tokens: {summary['tokens_per_s']} tok/s aggregate; "
          f"TTFT p50 {summary['ttft_p50_ms']} ms, p99 {summary['ttft_p99_ms']} ms; "
          f"peak running sequences {summary['running_peak']:g}")
    if "rss_first_quartile_mib" in summary:
        print(f"server RSS: first quartile {summary['rss_first_quartile_mib']} MiB, "
              f"last quartile {summary['rss_last_quartile_mib']} MiB ({summary['rss_samples']} samples)")
    print(f"after the run: {summary['metrics_after']}")
    for error in summary["failures"]:
        print(f"  failure: {error}")
    for name, ok in summary["checks"].items():
        print(f"check {name}: {'ok' if ok else 'FAILED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
