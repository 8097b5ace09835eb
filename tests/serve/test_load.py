"""Load: tools/serve_load.py (64 concurrent streaming clients) against a dedicated `xmoe serve --max-batch 64` on
the tiny model for a bounded time. Its checks must all hold: no failed request, every stream complete and in
order (role first, one finish_reason, usage, [DONE] last; token count = usage), the server idle again after the
clients that left mid-stream (no running sequence, no KV blocks), RSS flat after warm-up.

The stream checker itself is tested first on hand-made streams with one defect each, so a checker that cannot
fail would fail here.
"""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import serve_load  # noqa: E402


def chunk(delta, finish=None, tokens=0):
    choice = {"index": 0, "delta": delta, "finish_reason": finish,
              "logprobs": {"content": [{"token": "x", "logprob": -1.0}] * tokens} if tokens else None}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice], "usage": None}


def good_stream(finish="length"):
    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    return [chunk({"role": "assistant", "content": ""}), chunk({"content": "a"}, tokens=1),
            chunk({"content": "bc"}, tokens=2), chunk({}, finish), usage]


def events(chunks):
    return [json.dumps(c) for c in chunks] + ["[DONE]"]


def test_checker_accepts_a_well_formed_stream():
    assert serve_load.check_stream(events(good_stream()), max_tokens=3) == ([], 3)
    assert serve_load.check_stream(events(good_stream("stop")), max_tokens=10) == ([], 3)


def defects():
    s = good_stream()
    yield "a duplicated content event", events(s[:2] + [s[1]] + s[2:])
    yield "a lost content event", events(s[:1] + s[2:])
    yield "no [DONE]", events(s)[:-1]
    yield "two [DONE]", events(s) + ["[DONE]"]
    yield "an event after [DONE]", events(s[:-1]) + [json.dumps(s[-1])]
    yield "two finish reasons", events(s[:3] + [chunk({}, "stop")] + s[3:])
    yield "role not first", events([s[1], s[0]] + s[2:])
    yield "no usage", events(s[:-1])
    mixed = copy.deepcopy(s)
    mixed[2]["id"] = "chatcmpl-2"
    yield "two ids", events(mixed)
    short = copy.deepcopy(s)
    yield "length before max_tokens", events(short)  # checked with max_tokens=4 below
    yield "not JSON", events(s)[:2] + ["{oops"] + events(s)[2:]


@pytest.mark.parametrize("name,stream", list(defects()), ids=[name for name, _ in defects()])
def test_checker_flags_each_defect(name, stream):
    problems, _ = serve_load.check_stream(stream, max_tokens=4 if name == "length before max_tokens" else 3)
    assert problems, f"the checker missed: {name}"


def test_64_streaming_clients(make_server, tmp_path):
    served = make_server("--max-batch", "64")
    summary_file = tmp_path / "load.json"
    command = [sys.executable, str(REPO / "tools" / "serve_load.py"), "--base-url", served.base_url,
               "--clients", "64", "--warmup", "3", "--duration", "12", "--pid", str(served.proc.pid),
               "--json", str(summary_file)]
    if served.api_key:
        command += ["--api-key", served.api_key]
    run = subprocess.run(command, capture_output=True, text=True, timeout=180)
    print(run.stdout, run.stderr)
    summary = json.loads(summary_file.read_text())
    assert summary["failed"] == 0, summary["failures"]
    assert summary["completed"] > 64 and summary["cancelled"] > 0
    assert summary["checks"] == {"no_failed_requests": True, "server_idle_after_cancellations": True,
                                 "rss_flat": True}
    # Requests from many connections were in the batch at once (one continuous batch, not one at a time).
    assert summary["running_peak"] >= 16
    assert run.returncode == 0
