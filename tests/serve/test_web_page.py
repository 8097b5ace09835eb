"""The chat page at GET / in a real headless Chromium (Debian's chromium + chromium-driver, PyPI selenium).

Two servers drive the page:
- the real `xmoe serve` on the tiny random model (conftest's `server`): the page loads from the binary, lists the
  model, streams an answer through POST /v1/chat/completions (Chromium's own network log is the witness), the
  answer equals what the openai SDK gets for the same greedy request, Stop ends a long generation and keeps the
  partial answer, the server's error message is shown;
- a scripted OpenAI stream (a few lines of http.server below) for what a random model cannot be made to say:
  reasoning_content then content (the thinking section opens, then collapses), markup in model text (shown as
  text, never parsed), and the exact request body the settings produce.

Screenshots go to $XMOE_TEST_ARTEFACTS (default build/test-artefacts/).
"""

import json
import os
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE_FILE = REPO / "src" / "serve" / "web" / "chat.html"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="headless Chromium not installed (Debian packages chromium and chromium-driver)")


def artefacts_dir() -> Path:
    path = Path(os.environ.get("XMOE_TEST_ARTEFACTS", REPO / "build" / "test-artefacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,800", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    # Chromium leaves its singleton-socket folder in TMPDIR: keep it in the test's own temporary folder.
    env = dict(os.environ, TMPDIR=str(tmp_path))
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, env=env), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


# --- page helpers -------------------------------------------------------------------------------------------

# Records, on every DOM change of the conversation, the last assistant turn's state: the test sees the stream
# as the page showed it, piece by piece, however fast it came.
TRACE_JS = """
window.__trace = [];
const messages = document.getElementById('messages');
new MutationObserver(() => {
  const all = messages.querySelectorAll('.message.assistant');
  if (!all.length) return;
  const last = all[all.length - 1];
  const d = last.querySelector('details.thinking');
  window.__trace.push({answer: last.querySelector('.bubble').textContent,
                       thinking: d ? d.querySelector('.thinking-text').textContent : null,
                       open: d ? d.open : null, state: last.dataset.state || null});
}).observe(messages, {subtree: true, childList: true, characterData: true, attributes: true});
"""


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def open_page(driver, base_url, api_key=None):
    driver.get(base_url + "/")
    driver.execute_script("localStorage.clear();")
    driver.get(base_url + "/")
    if api_key:
        set_settings(driver, api_key=api_key)
    driver.execute_script(TRACE_JS)


def set_settings(driver, **values):
    ids = {"system": "system-prompt", "temperature": "temperature", "top_p": "top-p", "max_tokens": "max-tokens",
           "api_key": "api-key"}
    if driver.find_element("id", "settings").get_attribute("hidden") is not None:
        driver.find_element("id", "settings-toggle").click()
    for name, value in values.items():
        if name == "thinking":
            box = driver.find_element("id", "thinking")
            if box.is_selected() != value:
                box.click()
            continue
        field = driver.find_element("id", ids[name])
        field.clear()
        field.send_keys(str(value))
        # a change event, as leaving the field would fire
        driver.execute_script("arguments[0].dispatchEvent(new Event('change'));", field)


def send_message(driver, text):
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element("id", "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def last_assistant(driver):
    return driver.execute_script("""
      const all = document.querySelectorAll('#messages .message.assistant');
      if (!all.length) return null;
      const m = all[all.length - 1], d = m.querySelector('details.thinking');
      return {answer: m.querySelector('.bubble').textContent, state: m.dataset.state || null,
              thinking: d ? d.querySelector('.thinking-text').textContent : null, open: d ? d.open : null,
              summary: d ? d.querySelector('summary').textContent : null,
              markup: m.querySelector('.bubble').querySelectorAll('*').length};""")


def trace(driver):
    return driver.execute_script("return window.__trace;")


def chat_requests(driver):
    """POSTs to /v1/chat/completions as Chromium's network log saw them: (request, response) pairs."""
    requests, responses = {}, {}
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            request = params["request"]
            if request["url"].endswith("/v1/chat/completions") and request["method"] == "POST":
                requests[params["requestId"]] = request
        elif message["method"] == "Network.responseReceived":
            responses[params["requestId"]] = params["response"]
    return [(request, responses.get(rid)) for rid, request in requests.items()]


def screenshot(driver, name):
    path = artefacts_dir() / name
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 0
    return path


def header(headers, name):
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


# --- the real server ----------------------------------------------------------------------------------------


def test_page_is_served_from_the_binary(server):
    response = httpx.get(server.base_url + "/", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].replace(" ", "").lower() == "text/html;charset=utf-8"
    assert response.content == PAGE_FILE.read_bytes()


def test_chat_streams_through_the_openai_endpoint(server, browser):
    import openai

    open_page(browser, server.base_url, server.api_key)
    wait_for(lambda: browser.find_element("id", "model-name").text == server.model, 15, "the model name")
    settings = {"system": "You are terse.", "temperature": 0, "top_p": 0.9, "max_tokens": 256, "thinking": False}
    set_settings(browser, **settings)
    browser.find_element("id", "settings-toggle").click()  # close the panel again
    # The server merges the deltas its writer has not sent yet into one event, and the tiny model writes 24
    # tokens before the first event goes out about half the time (seen in CI: the whole answer in one piece):
    # 256 tokens keep it streaming long enough for the page to show several pieces.
    prompt = "Write a very long story."
    send_message(browser, prompt)
    wait_for(lambda: (last_assistant(browser) or {}).get("state") == "done", 60, "the answer to finish")
    shown = last_assistant(browser)
    assert shown["answer"], "the assistant's text stayed empty"
    assert browser.find_element("id", "error").get_attribute("hidden") is not None
    assert browser.find_element("id", "stop").get_attribute("hidden") is not None

    # The text arrived in pieces, each extending the last (streamed, not one final paint).
    answers = [t["answer"] for t in trace(browser)]
    grown = [a for i, a in enumerate(answers) if a and (i == 0 or a != answers[i - 1])]
    assert len(grown) >= 2, f"the answer appeared in one piece: {grown!r}"
    assert all(b.startswith(a) for a, b in zip(grown, grown[1:]))
    assert grown[-1] == shown["answer"]

    # Chromium's network log: one POST to the OpenAI endpoint, streamed back as SSE, carrying the settings.
    sent = chat_requests(browser)
    assert len(sent) == 1
    request, response = sent[0]
    body = json.loads(request["postData"])
    assert body["stream"] is True and body["model"] == server.model
    assert body["messages"] == [{"role": "system", "content": settings["system"]},
                                {"role": "user", "content": prompt}]
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0, 0.9, 256)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    if server.api_key:
        assert header(request["headers"], "Authorization") == "Bearer " + server.api_key
    assert response["status"] == 200
    assert header(response["headers"], "Content-Type").startswith("text/event-stream")

    # The same greedy request through the official SDK gives the text the page showed.
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key or "none")
    reference = client.chat.completions.create(
        model=server.model, messages=body["messages"], temperature=0, top_p=0.9, max_tokens=256,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert shown["answer"] == reference.choices[0].message.content
    screenshot(browser, "web-page-chat.png")

    # A narrow (phone) window: nothing overflows sideways.
    browser.set_window_size(390, 800)
    time.sleep(0.2)
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth;")
    screenshot(browser, "web-page-narrow.png")


def metric(base_url, api_key, name):
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    text = httpx.get(base_url + "/metrics", headers=headers, timeout=10).text
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name) and not line.startswith("#") and line[len(name)] in " {"]
    assert values, f"{name} missing from /metrics"
    return sum(values)


def test_stop_ends_the_stream_and_keeps_the_partial_answer(server, browser):
    import openai

    # A long generation: greedy on this prompt runs to the context limit (checked through the SDK first), and
    # the browser's network is throttled, so the stream is still arriving when Stop is pressed.
    prompt = "Write a very long story."
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key or "none")
    full = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": prompt}],
                                          temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens > 1000

    open_page(browser, server.base_url, server.api_key)
    wait_for(lambda: browser.find_element("id", "model-name").text == server.model, 15, "the model name")
    set_settings(browser, temperature=0, max_tokens="", thinking=False)
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.emulateNetworkConditions", {
        "offline": False, "latency": 0, "downloadThroughput": 20_000, "uploadThroughput": -1})
    send_message(browser, prompt)
    wait_for(lambda: (last_assistant(browser) or {}).get("answer"), 60, "the first streamed text")
    browser.find_element("id", "stop").click()
    wait_for(lambda: (last_assistant(browser) or {}).get("state"), 10, "the turn to end")
    stopped = last_assistant(browser)
    assert stopped["state"] == "stopped"
    assert stopped["answer"] and full.choices[0].message.content.startswith(stopped["answer"])
    assert len(stopped["answer"]) < len(full.choices[0].message.content)
    time.sleep(0.5)
    assert last_assistant(browser)["answer"] == stopped["answer"], "text kept arriving after Stop"
    assert browser.find_element("id", "stop").get_attribute("hidden") is not None
    assert browser.find_element("id", "send").is_displayed()
    browser.execute_cdp_cmd("Network.emulateNetworkConditions", {
        "offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    # The server let go of the sequence: nothing running, no KV-cache blocks held.
    wait_for(lambda: metric(server.base_url, server.api_key, "xmoe_running_sequences") == 0
             and metric(server.base_url, server.api_key, "xmoe_kv_cache_blocks_used") == 0, 10,
             "the server to release the stopped sequence")
    screenshot(browser, "web-page-stopped.png")

    # The partial answer is part of the conversation: the next request carries it.
    browser.get_log("performance")
    set_settings(browser, max_tokens=4)
    send_message(browser, "Go on.")
    wait_for(lambda: (last_assistant(browser) or {}).get("state") == "done", 60, "the second answer")
    body = json.loads(chat_requests(browser)[-1][0]["postData"])
    assert body["messages"][-2:] == [{"role": "assistant", "content": stopped["answer"]},
                                     {"role": "user", "content": "Go on."}]


def test_server_error_message_is_shown(server, browser):
    open_page(browser, server.base_url, server.api_key)
    wait_for(lambda: browser.find_element("id", "model-name").text == server.model, 15, "the model name")
    set_settings(browser, temperature=7)  # outside OpenAI's [0, 2]
    send_message(browser, "Hello")
    error = browser.find_element("id", "error")
    wait_for(lambda: error.get_attribute("hidden") is None, 30, "the error banner")
    # The message is the API's own, as the SDK reports it for the same request.
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key or "none")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Hello"}],
                                       temperature=7)
    assert error.text == raised.value.body["message"]
    # The failed turn is taken back and its text returned to the box.
    assert last_assistant(browser) is None
    assert browser.find_element("id", "input").get_attribute("value") == "Hello"


# --- a scripted OpenAI stream -------------------------------------------------------------------------------

REASONING = ["The user ", "greets me; ", "answer <politely>."]
ANSWER = ["Hello ", "<b>there</b> & ", "<img src=x onerror=\"document.title='pwned'\">", "\nSecond line."]


class ScriptedOpenAI:
    """GET / (the page file), GET /v1/models, and a POST /v1/chat/completions that streams REASONING as
    delta.reasoning_content then ANSWER as delta.content, a piece every `pause` seconds; records each body."""

    def __init__(self, pause=0.15):
        self.bodies, self.pause = [], pause
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/":
                    self.reply(200, "text/html; charset=utf-8", PAGE_FILE.read_bytes())
                elif self.path == "/v1/models":
                    self.reply(200, "application/json",
                               json.dumps({"object": "list", "data": [{"id": "scripted-model", "object": "model"}]}))
                else:
                    self.reply(404, "application/json", "{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                scripted.bodies.append({"body": body, "authorization": self.headers.get("Authorization")})
                if body.get("temperature", 0) > 2:
                    self.reply(400, "application/json", json.dumps({"error": {
                        "message": "temperature: must be in [0, 2], got 5", "type": "invalid_request_error",
                        "param": "temperature", "code": None}}))
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "scripted-model"}

                def event(delta, finish=None):
                    data = dict(chunk, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
                    self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(scripted.pause)

                event({"role": "assistant", "content": ""})
                for piece in REASONING:
                    event({"reasoning_content": piece})
                for piece in ANSWER:
                    event({"content": piece})
                event({}, "stop")
                usage = {"prompt_tokens": 9, "completion_tokens": 17, "total_tokens": 26}
                self.wfile.write(f"data: {json.dumps(dict(chunk, choices=[], usage=usage))}\n\ndata: [DONE]\n\n"
                                 .encode())

            def reply(self, status, content_type, body):
                data = body if isinstance(body, bytes) else body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    server = ScriptedOpenAI()
    yield server
    server.close()


def test_thinking_collapses_when_the_answer_starts_and_text_stays_text(scripted, browser):
    open_page(browser, scripted.base_url)
    wait_for(lambda: browser.find_element("id", "model-name").text == "scripted-model", 10, "the model name")
    send_message(browser, "Hi!")
    wait_for(lambda: (last_assistant(browser) or {}).get("state") == "done", 30, "the scripted answer")
    shown = last_assistant(browser)
    assert shown["thinking"] == "".join(REASONING)
    assert shown["answer"] == "".join(ANSWER)
    assert shown["markup"] == 0 and browser.title == "xmoe chat", "model text was parsed as HTML"
    assert shown["open"] is False and shown["summary"].startswith("Thought for")

    # While only reasoning had arrived, the thinking section was open; once the answer began, closed.
    steps = trace(browser)
    assert any(s["open"] is True and s["thinking"] and not s["answer"] for s in steps)
    assert all(s["open"] is False for s in steps if s["answer"])
    meta = browser.find_element("css selector", "#messages .message.assistant .meta").text
    assert "17 tokens" in meta

    screenshot(browser, "web-page-thinking-collapsed.png")
    browser.find_element("css selector", "details.thinking summary").click()
    screenshot(browser, "web-page-thinking-open.png")


def test_settings_and_history_go_into_the_request(scripted, browser):
    open_page(browser, scripted.base_url)
    wait_for(lambda: browser.find_element("id", "model-name").text == "scripted-model", 10, "the model name")
    set_settings(browser, system="Answer in French.", temperature=0.3, top_p=0.8, max_tokens=77, thinking=False,
                 api_key="sk-test-123")
    send_message(browser, "First line")
    wait_for(lambda: (last_assistant(browser) or {}).get("state") == "done", 30, "the first answer")
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element("id", "input")
    box.send_keys("two")
    box.send_keys(Keys.SHIFT, Keys.ENTER)  # Shift+Enter: a new line, not a send
    box.send_keys("lines")
    assert len(scripted.bodies) == 1
    box.send_keys(Keys.ENTER)
    wait_for(lambda: len(scripted.bodies) == 2, 10, "the second request")

    first, second = scripted.bodies
    assert first["authorization"] == "Bearer sk-test-123"
    body = second["body"]
    assert body["model"] == "scripted-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.3, 0.8, 77)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["messages"] == [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "First line"},
        {"role": "assistant", "content": "".join(ANSWER)},  # the answer only, not its reasoning
        {"role": "user", "content": "two\nlines"},
    ]
    # The settings, API key included, survive a reload (localStorage).
    browser.get(scripted.base_url + "/")
    values = browser.execute_script(
        "return ['system-prompt','temperature','top-p','max-tokens','api-key']"
        ".map(id => document.getElementById(id).value).concat([document.getElementById('thinking').checked]);")
    assert values == ["Answer in French.", "0.3", "0.8", "77", "sk-test-123", False]


def test_error_body_message_is_shown(scripted, browser):
    open_page(browser, scripted.base_url)
    set_settings(browser, temperature=5)
    send_message(browser, "Hello")
    error = browser.find_element("id", "error")
    wait_for(lambda: error.get_attribute("hidden") is None, 10, "the error banner")
    assert error.text == "temperature: must be in [0, 2], got 5"
    screenshot(browser, "web-page-error.png")
