"""A small OpenAI-compatible server on loopback for the server-engine tests (no vLLM needed).

It answers like vLLM does where the engine looks: /health, /version, /v1/models (with max_model_len),
/metrics (a `vllm:cache_config_info{...}` line), /tokenize, /v1/chat/completions, /v1/completions.
Faults are scripted per test: HTTP 500s, slow answers (timeouts), a server stopped mid-run.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer_for(messages: list[dict], index: int) -> str:
    """Deterministic answer: the last user message reversed word by word, plus the choice index."""
    last = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    return " ".join(reversed(last.split())) + f" #{index}"


class FakeOpenAIServer:
    def __init__(self, port: int = 0, cache_dtype: str = "auto", skip_layers: str = "[]",
                 model: str = "fake-model", max_model_len: int = 4096, reasoning: bool = False,
                 version: str = "0.32.0-fake"):
        self.version = version
        self.cache_dtype = cache_dtype
        self.skip_layers = skip_layers
        self.model = model
        self.max_model_len = max_model_len
        self.reasoning = reasoning
        self.fail_next = 0  # answer this many generation calls with HTTP 500
        self.slow_next = 0  # sleep slow_s before answering this many generation calls
        self.slow_s = 0.0
        self.metrics_enabled = True
        self.lock = threading.Lock()
        self.generation_calls = 0
        self.completed: list[str] = []  # request ids (first user message) answered with 200
        self.auth_headers: list[str] = []
        self.bodies: list[dict] = []
        self._conns: list[socket.socket] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> "FakeOpenAIServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop like a killed process: no new connections, and open keep-alive ones cut."""
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
        with self.lock:
            conns, self._conns = list(self._conns), []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            except OSError:
                pass

    # ------------------------------------------------------------------------------------------

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else each response's body waits 40 ms for a delayed ACK

            def log_message(self, *args):  # keep test output clean
                pass

            def setup(self):
                super().setup()
                with server.lock:
                    server._conns.append(self.connection)

            def _send(self, code: int, body, content_type: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                with server.lock:
                    server.auth_headers.append(self.headers.get("Authorization", ""))
                if self.path == "/health":
                    return self._send(200, "", "text/plain")
                if self.path == "/version":
                    return self._send(200, {"version": server.version})
                if self.path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [
                        {"id": server.model, "object": "model", "root": server.model,
                         "max_model_len": server.max_model_len}]})
                if self.path == "/metrics":
                    if not server.metrics_enabled:
                        return self._send(404, {"error": "not found"})
                    labels = (f'block_size="16",cache_dtype="{server.cache_dtype}",enable_prefix_caching="True",'
                              f'engine="0",gpu_memory_utilization="0.9",'
                              f'kv_cache_dtype_skip_layers="{server.skip_layers}",num_gpu_blocks="1234"')
                    text = ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                            "# TYPE vllm:cache_config_info gauge\n"
                            f"vllm:cache_config_info{{{labels}}} 1.0\n")
                    return self._send(200, text, "text/plain")
                return self._send(404, {"error": "not found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.auth_headers.append(self.headers.get("Authorization", ""))
                if self.path == "/tokenize":
                    if "messages" in body:
                        text = " ".join(m["content"] for m in body["messages"])
                        count = len(text.split()) + 3 * len(body["messages"]) + 2  # template tokens
                    else:
                        count = len(body.get("prompt", "").split()) + 1
                    return self._send(200, {"count": count, "max_model_len": server.max_model_len,
                                            "tokens": list(range(count))})
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    return self._send(404, {"error": "not found"})
                with server.lock:
                    server.generation_calls += 1
                    server.bodies.append(body)
                    fail = server.fail_next > 0
                    if fail:
                        server.fail_next -= 1
                    slow = server.slow_next > 0
                    if slow:
                        server.slow_next -= 1
                last = (body.get("messages") or [{"content": body.get("prompt", "")}])[-1]["content"]
                if "REJECT" in last:
                    return self._send(400, {"error": {"message": "prompt too long", "type": "BadRequestError"}})
                if fail:
                    return self._send(500, {"error": {"message": "scripted failure", "type": "InternalServerError"}})
                if slow:
                    time.sleep(server.slow_s)
                n = int(body.get("n", 1))
                if self.path == "/v1/chat/completions":
                    messages = body["messages"]
                    choices = []
                    for i in range(n):
                        text = answer_for(messages, i)
                        message = {"role": "assistant", "content": text}
                        if server.reasoning:
                            message["reasoning_content"] = f"thinking about choice {i}"
                        choices.append({"index": i, "message": message, "finish_reason": "stop",
                                        "token_ids": list(range(len(text.split())))})
                    prompt_tokens = len(" ".join(m["content"] for m in messages).split())
                    key = messages[-1]["content"]
                else:
                    choices = [{"index": i, "text": body["prompt"][::-1], "finish_reason": "length"}
                               for i in range(n)]
                    prompt_tokens = len(body["prompt"].split())
                    key = body["prompt"]
                out_tokens = sum(len(c.get("message", c).get("content", c.get("text", "")).split()) for c in choices)
                with server.lock:
                    server.completed.append(key)
                return self._send(200, {
                    "id": "cmpl-fake", "object": "chat.completion", "created": int(time.time()),
                    "model": server.model, "choices": choices,
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": out_tokens,
                              "total_tokens": prompt_tokens + out_tokens,
                              "prompt_tokens_details": {"cached_tokens": 0}},
                })

        return Handler
