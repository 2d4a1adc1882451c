"""A fake OpenAI-compatible streaming server whose latency follows a known law (tests, client overhead).

    TTFT(n) = ttft_a_ms + ttft_b_ms * n + ttft_c_ms * n^2      (n = prompt tokens)
    ITL(n)  = itl_a_ms + itl_b_ms * n                          (every gap between streamed tokens)

Token i is due ITL * i after the first token was actually sent (absolute deadlines from there), so a late
wake-up delays one token but never the ones after it, and a late first token does not shorten the gaps
that follow: a request's mean ITL stays exact even on a busy machine. With every coefficient 0 it answers as fast as it can: what a client
then measures is its own overhead plus loopback HTTP, which `fp8eval.perf` reports as the client floor.

It speaks the part of vLLM's API the perf client and `vllm bench serve` use: /health, /version,
/v1/models (with max_model_len), /metrics (`vllm:cache_config_info` with num_gpu_blocks and block_size,
prompt/prefix-cache counters), /tokenize and streaming /v1/completions. Prompts are token-id lists
(a string prompt counts one token per whitespace-separated word). Standard library only.

    python -m fp8eval.perf.fake_server --port 8000 --itl-a-ms 5 --itl-b-ms 0.001
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self


@dataclass
class LatencyLaw:
    itl_a_ms: float = 0.0
    itl_b_ms: float = 0.0
    ttft_a_ms: float = 0.0
    ttft_b_ms: float = 0.0
    ttft_c_ms: float = 0.0

    def ttft_s(self, n: int) -> float:
        """Seconds to the first token for an `n`-token prompt: a + b n + c n^2 (ms)."""
        return (self.ttft_a_ms + self.ttft_b_ms * n + self.ttft_c_ms * n * n) / 1000.0

    def itl_s(self, n: int) -> float:
        """Seconds between tokens with `n` tokens of context: a + b n (ms)."""
        return (self.itl_a_ms + self.itl_b_ms * n) / 1000.0


@dataclass
class FakeSettings:
    model: str = "fake-model"
    max_model_len: int = 32768
    cache_dtype: str = "auto"
    block_size: int = 16
    num_gpu_blocks: int = 4096
    law: LatencyLaw = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.law is None:
            self.law = LatencyLaw()


def _prompt_len(prompt) -> int:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


def _sleep_until(deadline: float) -> None:
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


class _Handler(BaseHTTPRequestHandler):
    settings: FakeSettings
    counters: dict
    lock: threading.Lock

    def setup(self):
        super().setup()
        # Without this, Nagle's algorithm holds small SSE chunks back and adds tens of ms to "ITL".
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args):
        pass

    def _json(self, obj, status: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        s = self.settings
        if self.path == "/health":
            self._json({})
        elif self.path == "/version":
            self._json({"version": "fake-perf-server"})
        elif self.path.startswith("/v1/models"):
            self._json({"object": "list", "data": [
                {"id": s.model, "object": "model", "root": s.model, "max_model_len": s.max_model_len}]})
        elif self.path == "/metrics":
            with self.lock:
                c = dict(self.counters)
            text = (
                f'vllm:cache_config_info{{block_size="{s.block_size}",cache_dtype="{s.cache_dtype}",'
                f'enable_prefix_caching="False",num_gpu_blocks="{s.num_gpu_blocks}"}} 1.0\n'
                f'vllm:prompt_tokens_total{{model_name="{s.model}"}} {c["prompt_tokens"]}\n'
                f'vllm:prefix_cache_queries_total{{model_name="{s.model}"}} {c["prompt_tokens"]}\n'
                f'vllm:prefix_cache_hits_total{{model_name="{s.model}"}} 0.0\n')
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json({"error": "not found"}, 404)

    def do_POST(self):
        arrived = time.perf_counter()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/tokenize":
            self._json({"count": _prompt_len(body.get("prompt", "")), "max_model_len": self.settings.max_model_len})
            return
        if self.path != "/v1/completions":
            self._json({"error": "not found"}, 404)
            return
        n = _prompt_len(body.get("prompt", []))
        max_tokens = int(body.get("max_tokens") or 16)
        s = self.settings
        if n + max_tokens > s.max_model_len:
            self._json({"error": {"message": f"{n} + {max_tokens} tokens exceed max_model_len {s.max_model_len}"}}, 400)
            return
        with self.lock:
            self.counters["prompt_tokens"] += n
        first = arrived + s.law.ttft_s(n)
        gap = s.law.itl_s(n)
        rid = f"cmpl-fake-{int(arrived * 1e6)}"
        if not body.get("stream"):
            _sleep_until(first + gap * (max_tokens - 1))
            self._json({"id": rid, "object": "text_completion", "model": s.model,
                        "choices": [{"index": 0, "text": " t" * max_tokens, "finish_reason": "length"}],
                        "usage": {"prompt_tokens": n, "completion_tokens": max_tokens,
                                  "total_tokens": n + max_tokens}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            _sleep_until(first)
            sent_first = time.perf_counter()
            for i in range(max_tokens):
                _sleep_until(sent_first + gap * i)
                chunk = {"id": rid, "object": "text_completion", "model": s.model,
                         "choices": [{"index": 0, "text": " t", "token_ids": [7],
                                      "finish_reason": "length" if i == max_tokens - 1 else None}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"id": rid, "object": "text_completion", "model": s.model, "choices": [],
                         "usage": {"prompt_tokens": n, "completion_tokens": max_tokens,
                                   "total_tokens": n + max_tokens}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a cancelled request): nothing to answer


class FakeServer:
    """The fake server on a loopback port, in a background thread. `with FakeServer(...) as srv:`"""

    def __init__(self, settings: FakeSettings | None = None, host: str = "127.0.0.1", port: int = 0):
        self.settings = settings or FakeSettings()
        handler = type("Handler", (_Handler,), {"settings": self.settings, "counters": {"prompt_tokens": 0},
                                                "lock": threading.Lock()})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="fake-perf-server", daemon=True)

    def start(self) -> Self:
        """Start serving in the background thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def fake_server_process(law: LatencyLaw, **settings) -> Iterator[str]:
    """The fake server in a process of its own; yields its URL. Its sleeping threads and a client's event
    loop then do not share one GIL, so the law it serves is not disturbed by the client timing it.
    settings: model, max_model_len, cache_dtype, num_gpu_blocks (command-line names of main())."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**law.__dict__, **settings}.items()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "fp8eval.perf.fake_server", f"--port={port}", *flags],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        if not proc.stdout.readline():  # the URL, printed once it listens
            raise RuntimeError(f"the fake server did not start (exit {proc.wait()})")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.stdout.close()


def main(argv: list[str] | None = None) -> None:
    """Run the fake server in the foreground (for `vllm bench serve` by hand, or another client)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    # vLLM's own names are accepted too (--served-model-name, --kv-cache-dtype) and other vLLM flags are
    # ignored, so this can stand in for `python -m vllm.entrypoints.openai.api_server` in tests.
    p.add_argument("--model", "--served-model-name", dest="model", default="fake-model")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--cache-dtype", "--kv-cache-dtype", dest="cache_dtype", default="auto")
    p.add_argument("--num-gpu-blocks", type=int, default=4096)
    for name in ("itl-a-ms", "itl-b-ms", "ttft-a-ms", "ttft-b-ms", "ttft-c-ms"):
        p.add_argument(f"--{name}", type=float, default=0.0)
    a, _ = p.parse_known_args(argv)
    law = LatencyLaw(a.itl_a_ms, a.itl_b_ms, a.ttft_a_ms, a.ttft_b_ms, a.ttft_c_ms)
    srv = FakeServer(FakeSettings(a.model, a.max_model_len, a.cache_dtype, 16, a.num_gpu_blocks, law), a.host, a.port)
    print(srv.url, flush=True)
    try:
        srv.httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
