"""Operations of `xmoe serve` over real HTTP: auth, error statuses in each API's shape, /health, /metrics, the
access log, Tutel's /chat, cancellation by a client that leaves, the bounded queue, the context limit,
graceful shutdown, and greedy output equal to `xmoe generate` token for token."""
import json
import re
import signal
import subprocess
import threading
import time

import httpx
import pytest

from conftest import XMOE

OPENAI_PATHS = ["/v1/chat/completions", "/v1/completions"]
ANTHROPIC_PATHS = ["/v1/messages", "/v1/messages/count_tokens"]


def assert_openai_error(r, status, type_=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    assert {"message", "type", "param", "code"} <= set(body["error"]), body
    assert body["error"]["message"]
    if type_:
        assert body["error"]["type"] == type_, body
    return body["error"]


def assert_anthropic_error(r, status, type_):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error", body
    assert body["error"]["type"] == type_, body
    assert body["error"]["message"]
    return body["error"]


def completion(server, **fields):
    body = {"model": server.model, "prompt": [1, 2, 3, 4, 5], "max_tokens": 8, "temperature": 0}
    body.update(fields)
    return httpx.post(server.base_url + "/v1/completions", json=body, headers=server.headers(), timeout=60)


def wait_for(condition, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_health_is_open_and_says_ok(server):
    r = httpx.get(server.base_url + "/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


@pytest.mark.parametrize("path", OPENAI_PATHS + ["/chat"])
def test_openai_routes_need_the_key(server, path):
    assert_openai_error(httpx.post(server.base_url + path, json={}), 401, "authentication_error")
    wrong = {"Authorization": "Bearer not-the-key"}
    assert_openai_error(httpx.post(server.base_url + path, json={}, headers=wrong), 401)
    assert_openai_error(httpx.get(server.base_url + "/v1/models"), 401)


@pytest.mark.parametrize("path", ANTHROPIC_PATHS)
def test_anthropic_routes_need_the_key(server, path):
    assert_anthropic_error(httpx.post(server.base_url + path, json={}), 401, "authentication_error")
    wrong = {"x-api-key": "not-the-key"}
    assert_anthropic_error(httpx.post(server.base_url + path, json={}, headers=wrong), 401,
                           "authentication_error")


@pytest.mark.parametrize("style", ["bearer", "x-api-key"])
def test_either_header_style_is_accepted(server, style):
    r = httpx.get(server.base_url + "/v1/models", headers=server.headers(style))
    assert r.status_code == 200, r.text
    assert [m["id"] for m in r.json()["data"]] == [server.model]
    headers = server.headers(style) | {"anthropic-version": "2099-12-31", "anthropic-beta": "made-up-beta"}
    r = httpx.post(server.base_url + "/v1/messages/count_tokens", headers=headers,
                   json={"model": server.model, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 0


def test_unknown_paths_answer_404_in_the_apis_shape(server):
    assert_openai_error(httpx.get(server.base_url + "/v1/nothing", headers=server.headers()), 404)
    assert_anthropic_error(httpx.post(server.base_url + "/v1/messages/nothing", headers=server.headers(), json={}),
                           404, "not_found_error")


def test_wrong_methods_answer_405_with_allow(server):
    r = httpx.get(server.base_url + "/v1/chat/completions", headers=server.headers())
    assert_openai_error(r, 405)
    assert r.headers["allow"] == "POST"
    r = httpx.delete(server.base_url + "/v1/messages", headers=server.headers())
    assert_anthropic_error(r, 405, "invalid_request_error")


def test_bodies_over_the_limit_answer_413(make_server):
    s = make_server("--max-body-mb", "1")
    big = {"model": s.model, "prompt": "x" * (2 << 20), "max_tokens": 1}
    assert_openai_error(httpx.post(s.base_url + "/v1/completions", json=big, headers=s.headers()), 413)
    big = {"model": s.model, "max_tokens": 1, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    assert_anthropic_error(httpx.post(s.base_url + "/v1/messages", json=big, headers=s.headers()), 413,
                           "request_too_large")
    assert completion(s).status_code == 200  # the server goes on


@pytest.mark.parametrize("path", OPENAI_PATHS)
def test_malformed_json_is_400_in_the_openai_shape(server, path):
    r = httpx.post(server.base_url + path, content=b'{"model": ', headers=server.headers())
    assert_openai_error(r, 400, "invalid_request_error")


@pytest.mark.parametrize("path", ANTHROPIC_PATHS)
def test_malformed_json_is_400_in_the_anthropic_shape(server, path):
    r = httpx.post(server.base_url + path, content=b"[1, 2", headers=server.headers())
    assert_anthropic_error(r, 400, "invalid_request_error")


def test_metrics_count_requests_tokens_and_latencies(server):
    before = server.metrics()
    r = completion(server, max_tokens=6, ignore_eos=True)
    assert r.status_code == 200
    after = server.metrics()
    key = 'xmoe_http_requests_total{route="/v1/completions",status="200"}'
    assert after[key] == before.get(key, 0) + 1
    assert after["xmoe_prompt_tokens_total"] - before["xmoe_prompt_tokens_total"] == 5
    assert after["xmoe_generation_tokens_total"] - before["xmoe_generation_tokens_total"] == 6
    assert after["xmoe_time_to_first_token_seconds_count"] == before["xmoe_time_to_first_token_seconds_count"] + 1
    assert after["xmoe_inter_token_latency_seconds_count"] == before["xmoe_inter_token_latency_seconds_count"] + 5
    assert after['xmoe_time_to_first_token_seconds_bucket{le="+Inf"}'] == after[
        "xmoe_time_to_first_token_seconds_count"]
    assert after["xmoe_kv_cache_blocks_total"] > 0
    for gauge in ["xmoe_queue_depth", "xmoe_running_sequences", "xmoe_kv_cache_blocks_used"]:
        assert gauge in after
    # The high-water mark saw the request's sequence in the batch.
    assert after["xmoe_running_sequences_peak"] >= 1
    text = httpx.get(server.base_url + "/metrics", headers=server.headers()).text
    assert "# TYPE xmoe_time_to_first_token_seconds histogram" in text
    assert "# TYPE xmoe_http_requests_total counter" in text


def test_access_log_has_one_line_per_request(server):
    r = completion(server, max_tokens=4, ignore_eos=True)
    assert r.status_code == 200
    httpx.get(server.base_url + "/v1/nothing", headers=server.headers())
    assert wait_for(lambda: '"GET /v1/nothing" 404' in server.stderr())
    lines = [l for l in server.stderr().splitlines() if '"POST /v1/completions" 200' in l]
    assert lines, server.stderr()
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ 127\.0\.0\.1 \"POST /v1/completions\" 200 [0-9.]+ms "
                     r"prompt_tokens=5 completion_tokens=4$", lines[-1]), lines[-1]


def test_tutel_chat_streams_plain_text(server):
    body = {"text": "Hello there", "max_tokens": 12, "temperature": 0}
    with httpx.stream("POST", server.base_url + "/chat", json=body, headers=server.headers(), timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        assert r.headers.get("transfer-encoding") == "chunked"
        pieces = list(r.iter_text())
    assert "".join(pieces)
    assert_openai_error(httpx.post(server.base_url + "/chat", json={"txt": "no"}, headers=server.headers()), 400)


def stream_events(response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


def test_a_client_that_leaves_mid_stream_cancels_its_sequence(server):
    body = {"model": server.model, "prompt": [7, 8, 9], "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    cancelled = server.metrics()["xmoe_requests_cancelled_total"]
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, headers=server.headers(),
                      timeout=60) as r:
        assert r.status_code == 200
        events = stream_events(r)
        for _ in range(3):
            next(events)
        m = server.metrics()
        assert m["xmoe_running_sequences"] == 1
        assert m["xmoe_kv_cache_blocks_used"] > 0
    # The connection is closed: the server notices at its next write and cancels the sequence.
    assert wait_for(lambda: server.metrics()["xmoe_running_sequences"] == 0
                    and server.metrics()["xmoe_kv_cache_blocks_used"] == 0)
    assert server.metrics()["xmoe_requests_cancelled_total"] == cancelled + 1
    generated = server.metrics()["xmoe_generation_tokens_total"]
    time.sleep(0.3)
    assert server.metrics()["xmoe_generation_tokens_total"] == generated, "nothing generated after the cancel"


def test_a_full_queue_answers_429_openai_and_529_anthropic(make_server):
    s = make_server("--max-batch", "1", "--max-queue", "1")
    long = {"model": s.model, "prompt": [5, 6, 7], "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=s.base_url, headers=s.headers(), timeout=60) as c1, \
            httpx.Client(base_url=s.base_url, headers=s.headers(), timeout=60) as c2:
        with c1.stream("POST", "/v1/completions", json=long) as running, \
                c2.stream("POST", "/v1/completions", json=long) as waiting:
            assert running.status_code == 200 and waiting.status_code == 200
            assert wait_for(lambda: s.metrics()["xmoe_queue_depth"] == 1)
            e = assert_openai_error(completion(s), 429)
            assert "--max-queue 1" in e["message"]
            r = httpx.post(s.base_url + "/v1/messages", headers=s.headers(), timeout=60,
                           json={"model": s.model, "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "hi"}]})
            assert_anthropic_error(r, 529, "overloaded_error")
    assert wait_for(lambda: s.metrics()["xmoe_running_sequences"] == 0)
    assert completion(s).status_code == 200


def test_prompts_beyond_the_context_are_400_naming_the_limit(make_server):
    s = make_server("--max-seq-len", "64")
    e = assert_openai_error(completion(s, prompt=list(range(1, 101)), max_tokens=1), 400, "invalid_request_error")
    assert "64" in e["message"], e
    e = assert_openai_error(completion(s, prompt=list(range(1, 65)), max_tokens=1), 400)  # no room to generate
    assert "64" in e["message"], e
    r = httpx.post(s.base_url + "/v1/messages", headers=s.headers(), timeout=60,
                   json={"model": s.model, "max_tokens": 10, "messages": [{"role": "user", "content": "x" * 300}]})
    assert "64" in assert_anthropic_error(r, 400, "invalid_request_error")["message"]
    assert completion(s, max_tokens=4).status_code == 200


def test_sigterm_stops_accepting_finishes_in_flight_and_exits_0(make_server):
    s = make_server("--shutdown-grace", "30")
    body = {"model": s.model, "prompt": [1, 2], "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    result = {}
    started = threading.Event()

    def client():
        with httpx.stream("POST", s.base_url + "/v1/completions", json=body, headers=s.headers(), timeout=60) as r:
            events = []
            for e in stream_events(r):
                events.append(e)
                started.set()
            result["finish"] = [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1]
            result["usage"] = events[-1]["usage"]

    t = threading.Thread(target=client)
    t.start()
    assert started.wait(60)
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(60) == 0
    t.join(60)
    assert result.get("finish") == "length", result  # the request in flight was finished, not cut off
    assert result["usage"]["completion_tokens"] == 2000
    with pytest.raises(httpx.ConnectError):
        httpx.get(s.base_url + "/health", timeout=5)
    assert "xmoe serve: stopped" in s.output()


def bytes_to_unicode():
    """GPT-2's byte <-> printable character table of byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def token_text(model_dir, token_id):
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    for t in tok["added_tokens"]:
        if t["id"] == token_id:
            return t["content"]
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    piece = next(k for k, v in tok["model"]["vocab"].items() if v == token_id)
    return bytes(byte_of[c] for c in piece).decode("utf-8", errors="replace")


def generate_greedy(model_dir, prompt_ids, max_tokens):
    r = subprocess.run([XMOE, "generate", "--model", str(model_dir), "--prompt-ids", ",".join(map(str, prompt_ids)),
                        "--max-tokens", str(max_tokens), "--temperature", "0", "--ignore-eos", "--no-stream",
                        "--print-ids"], capture_output=True, text=True, check=True)
    ids = [int(t) for t in re.search(r"generated ids: ([0-9,]+)", r.stderr).group(1).split(",")]
    return ids, r.stdout[:-1]  # the text and a newline


def test_greedy_over_http_equals_xmoe_generate_token_for_token(server):
    prompt = [17, 42, 99, 3, 250, 7, 64]
    ids, text = generate_greedy(server.model_dir, prompt, 24)
    assert len(ids) == 24
    body = {"model": server.model, "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    r = httpx.post(server.base_url + "/v1/completions", json=body, headers=server.headers(), timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert r.json()["usage"]["completion_tokens"] == 24
    assert choice["text"] == text
    # Each generated id's own text (GPT-2 byte-level vocabulary, lossy UTF-8) must be what the server reports.
    assert choice["logprobs"]["tokens"] == [token_text(server.model_dir, i) for i in ids]
    for lp, top in zip(choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]):
        assert lp <= 0
        assert list(top.values()) == [lp]  # greedy: the one best alternative is the chosen token
    # Streamed, the same text arrives.
    body["stream"] = True
    del body["logprobs"]
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, headers=server.headers(),
                      timeout=60) as s:
        streamed = "".join(e["choices"][0]["text"] for e in stream_events(s))
    assert streamed == text
