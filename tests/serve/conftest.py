"""Fixtures that run a real `xmoe serve` on a tiny random Qwen3-MoE checkpoint (made by `xmoe init-model`,
with its byte-level tokenizer and Qwen3 chat template) on a free loopback port.

`server` is one server for the whole session (API key required); `make_server(*flags)` starts more with other
flags (a tiny queue, a short context, ...) and stops them after the test. The binary is $XMOE_CLI (default
build/xmoe)."""
import os
import pathlib
import re
import signal
import subprocess
import threading
import time

import httpx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
XMOE = os.environ.get("XMOE_CLI", str(ROOT / "build" / "xmoe"))
TINY_CONFIG = pathlib.Path(__file__).with_name("tiny_qwen3_moe.json")
API_KEY = "xmoe-test-key"
MODEL_NAME = "tiny-qwen3-moe"
START_TIMEOUT_S = 120


class Server:
    """A running `xmoe serve`: .base_url (no /v1), .api_key, .model, .model_dir, .proc."""

    def __init__(self, model_dir, flags=(), api_key=API_KEY):
        self.model_dir = pathlib.Path(model_dir)
        self.api_key = api_key
        self.model = self.model_dir.name
        args = [XMOE, "serve", "--model", str(self.model_dir), "--port", "0", "--kv-cache-mb", "64"]
        if api_key:
            args += ["--api-key", api_key]
        args += list(flags)
        env = dict(os.environ)
        env.pop("XMOE_API_KEY", None)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self._stdout, self._stderr = [], []
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self.base_url = None
        threading.Thread(target=self._read, args=(self.proc.stdout, self._stdout), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self._stderr), daemon=True).start()
        if not self._listening.wait(START_TIMEOUT_S) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"xmoe serve did not start: {self.output()}")
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            try:
                if httpx.get(self.base_url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"xmoe serve never became healthy: {self.output()}")

    def _read(self, pipe, lines):
        for line in pipe:
            with self._lock:
                lines.append(line)
            m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
            if m:
                self.base_url = m.group(1)
                self._listening.set()

    def stderr(self):
        with self._lock:
            return "".join(self._stderr)

    def output(self):
        with self._lock:
            return "".join(self._stdout) + "".join(self._stderr)

    def headers(self, style="bearer"):
        if style == "bearer":
            return {"Authorization": f"Bearer {self.api_key}"}
        return {"x-api-key": self.api_key}

    def metrics(self):
        """/metrics as {sample name with labels: value}."""
        r = httpx.get(self.base_url + "/metrics", headers=self.headers(), timeout=30)
        r.raise_for_status()
        out = {}
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signals the server and waits; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def generate_checkpoint(out):
    subprocess.run([XMOE, "init-model", "--config", str(TINY_CONFIG), "--out", str(out), "--seed", "1"],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return generate_checkpoint(tmp_path_factory.mktemp("checkpoint") / MODEL_NAME)


@pytest.fixture(scope="session")
def server(model_dir):
    s = Server(model_dir)
    yield s
    s.stop()


@pytest.fixture
def make_server(model_dir):
    started = []

    def start(*flags, api_key=API_KEY):
        s = Server(model_dir, flags, api_key)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
