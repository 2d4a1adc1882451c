"""Benchmark 3, scheduling: the server engine keeps `engine.concurrency` requests in flight.

    python benchmarks/concurrency.py --concurrency 8 --requests 64 --tokens 20 --token-delay 0.01

Starts a loopback OpenAI-compatible server whose every completion takes tokens x token-delay seconds
(answering `max_tokens` words), runs `python -m fp8eval engine=server engine.base_url=...` against it and
reports the achieved concurrency: the time-average of requests in flight between the first request's
arrival and the last one's end. Target: within 10% of the setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _Server(ThreadingHTTPServer):
    # The stdlib's listen backlog of 5 drops a burst of new connections (8 at once here) until the
    # client retries them, which would count against the client; vLLM's uvicorn listens with 2048.
    request_queue_size = 128


class DelayServer:
    """Answers chat completions after a fixed per-token delay, logging (start, end) of each."""

    def __init__(self, tokens: int, token_delay: float, max_model_len: int = 32768):
        self.tokens, self.token_delay, self.max_model_len = tokens, token_delay, max_model_len
        self.spans: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _handler(self):
        srv = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body leave in two writes; with Nagle on, the body waits for the client's
            # delayed ACK (40 ms on Linux) after each response, outside the measured span.
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def _send(self, body, ctype="application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.startswith("/v1/models"):
                    self._send({"object": "list", "data": [{"id": "fake-model", "object": "model",
                                                            "max_model_len": srv.max_model_len}]})
                elif self.path.startswith("/metrics"):
                    self._send('vllm:cache_config_info{block_size="16",cache_dtype="auto",'
                               'kv_cache_dtype_skip_layers="[]",enable_prefix_caching="True"} 1.0\n', "text/plain")
                elif self.path.startswith("/version"):
                    self._send({"version": "0.0-benchmark"})
                else:
                    self._send({})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path.startswith("/tokenize"):
                    text = json.dumps(body.get("messages") or body.get("prompt"))
                    self._send({"count": max(1, len(text) // 4), "tokens": [], "max_model_len": srv.max_model_len})
                    return
                start = time.perf_counter()
                n = int(body.get("n") or 1)
                words = min(srv.tokens, int(body.get("max_tokens") or srv.tokens))
                time.sleep(words * srv.token_delay)
                with srv.lock:
                    srv.spans.append((start, time.perf_counter()))
                self._send({"id": "x", "object": "chat.completion", "model": "fake-model",
                            "choices": [{"index": i, "finish_reason": "length",
                                         "message": {"role": "assistant", "content": " ".join(["word"] * words)}}
                                        for i in range(n)],
                            "usage": {"prompt_tokens": 10, "completion_tokens": words * n, "total_tokens": 10 + words * n,
                                      "prompt_tokens_details": {"cached_tokens": 0}}})

        return H

    def achieved_concurrency(self) -> float:
        if not self.spans:
            return 0.0
        t0 = min(s for s, _ in self.spans)
        t1 = max(e for _, e in self.spans)
        return sum(e - s for s, e in self.spans) / (t1 - t0)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64, help="niah samples sent (task.repeats=1)")
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--token-delay", type=float, default=0.01)
    args = ap.parse_args()

    srv = DelayServer(args.tokens, args.token_delay)
    work = Path(tempfile.mkdtemp(prefix="fp8eval-conc-"))
    try:
        cmd = [sys.executable, "-m", "fp8eval", "engine=server", f"engine.base_url={srv.url}",
               f"engine.concurrency={args.concurrency}", "engine.served_model_name=fake-model",
               "engine.trust_declared_kv=true", "baseline=none", "kv=bf16", "task=niah",
               "task.lengths=[256]", "task.depths=[0,25,50,75,100]", f"task.needles_per_cell={-(-args.requests // 5)}",
               f"sampling.max_tokens={args.tokens}", f"records_dir={work / 'records'}", "progress=false",
               "report=false", f"hydra.run.dir={work / 'run'}"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   OPENAI_API_KEY="benchmark")
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        achieved = srv.achieved_concurrency()
        print(json.dumps({"concurrency": args.concurrency, "requests": len(srv.spans),
                          "achieved_concurrency": round(achieved, 2),
                          "ratio": round(achieved / args.concurrency, 3),
                          "met": abs(achieved / args.concurrency - 1) <= 0.10,
                          "ideal_s": round(len(srv.spans) * args.tokens * args.token_delay / args.concurrency, 2),
                          "wall_s": round(wall, 2), "loadavg_1m": round(os.getloadavg()[0], 2)}))
    finally:
        srv.close()


if __name__ == "__main__":
    main()
