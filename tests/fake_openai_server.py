"""A small OpenAI-compatible server on loopback for the server-engine tests (no vLLM needed).

It answers like vLLM does where the engine looks: /health, /version, /v1/models (with max_model_len),
/metrics (a `vllm:cache_config_info{...}` line), /tokenize, /v1/chat/completions, /v1/completions.
Faults are scripted per test: HTTP 500s, slow answers (timeouts), a server stopped mid-run, and broken
answers (`faults`, or `fault_fn` for random ones): see FAULTS.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def word_tokens(text: str) -> list[str]:
    """The fake tokenizer: each word with its leading whitespace is one token (BPE-like)."""
    return re.findall(r"\s*\S+|\s+$", text)


def token_id(piece: str) -> int:
    return 10 + int.from_bytes(piece.encode(), "little") % 9973


def echo_logprob(prev: int, tok: int) -> float:
    """The fake model's log-probability of `tok` after `prev`; its top token is prev + 1."""
    return -((prev * 7 + tok) % 11) / 4.0 - (0.0 if tok == prev + 1 else 0.5)


def answer_for(messages: list[dict], index: int) -> str:
    """Deterministic answer: the last user message reversed word by word, plus the choice index."""
    last = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    return " ".join(reversed(last.split())) + f" #{index}"


# Broken answers a generation call can get (tests/faults): HTTP 500; a 200 whose body is cut JSON;
# `choices: []`; one choice fewer than n; a null choice; another model's id; no `choices` key; impossible
# usage numbers (negative, huge, more cached than prompt tokens); and hostile transports: the answer
# trickled at one byte a second, a 50 MB answer, the connection cut mid-body.
FAULTS = ("500", "malformed", "empty_choices", "short_choices", "null_choice", "other_model", "no_choices",
          "usage_negative", "usage_huge", "cached_huge", "trickle", "huge", "cut")
HUGE_BYTES = 50 * 1024 * 1024


class FakeOpenAIServer:
    def __init__(self, port: int = 0, cache_dtype: str = "auto", skip_layers: str = "[]",
                 model: str = "fake-model", max_model_len: int = 4096, reasoning: bool = False,
                 keep_bodies: bool = True, version: str = "0.32.0-fake"):
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
        self.faults: list[str] = []  # FAULTS applied to the next generation calls, in order
        self.fault_fn = None  # (body, attempt) -> a FAULTS name or None; attempt counts calls of that body
        self.answer_fn = None  # (messages, index, seed) -> answer text; default answer_for
        self.tokenize_fn = None  # (body) -> the JSON answer of /tokenize (a hostile server's); default the fake's
        self.fault_counts: dict[str, int] = {}
        self.attempts: dict[str, int] = {}
        self.keep_bodies = keep_bodies
        self.lock = threading.Lock()
        self.generation_calls = 0
        self.completed: list[str] = []  # request ids (first user message) answered with 200
        self.auth_headers: list[str] = []
        self.headers_seen: list[tuple[str, dict[str, str]]] = []  # (path, headers) of every request
        self.hostile_paths: dict[str, str] = {}  # path -> "trickle" | "cut": how every answer to it is sent
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
                try:
                    self.wfile.write(data)
                except OSError:  # the client stopped reading (a refused 50 MB answer)
                    self.close_connection = True

            def _send_badly(self, how: str, data: bytes) -> None:
                """`trickle`: one byte a second (a per-read timeout never fires); `cut`: half the body,
                then the connection closes."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.flush()
                try:
                    if how == "cut":
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                    else:
                        for i in range(len(data)):
                            self.wfile.write(data[i:i + 1])
                            self.wfile.flush()
                            time.sleep(1.0)
                except OSError:
                    pass  # the client gave up
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def do_GET(self):
                with server.lock:
                    server.auth_headers.append(self.headers.get("Authorization", ""))
                    server.headers_seen.append((self.path, dict(self.headers.items())))
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
                    server.headers_seen.append((self.path, dict(self.headers.items())))
                if self.path in server.hostile_paths:
                    return self._send_badly(server.hostile_paths[self.path], json.dumps({"count": 3}).encode())
                if self.path == "/tokenize" and server.tokenize_fn is not None:
                    return self._send(200, server.tokenize_fn(body))
                if self.path == "/tokenize" and body.get("add_special_tokens") is not None and "prompt" in body:
                    ids = [token_id(t) for t in word_tokens(body["prompt"])]
                    ids = ([1] if body["add_special_tokens"] else []) + ids  # BOS id 1
                    return self._send(200, {"count": len(ids), "max_model_len": server.max_model_len,
                                            "tokens": ids})
                if self.path == "/v1/completions" and body.get("echo"):
                    ids = list(body["prompt"]) + [body["prompt"][-1] + 1]  # the greedy next token
                    lps = [None] + [echo_logprob(a, b) for a, b in zip(ids, ids[1:])]
                    tops = [None] + [{str(a + 1): echo_logprob(a, a + 1)} for a in ids[:-1]]
                    logprobs = {"tokens": [str(t) for t in ids], "token_logprobs": lps, "top_logprobs": tops}
                    return self._send(200, {"id": "cmpl-echo", "object": "text_completion", "model": server.model,
                                            "choices": [{"index": 0, "text": str(ids[-1]), "logprobs": logprobs,
                                                         "finish_reason": "length"}]})
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
                key_text = json.dumps(body.get("messages") or body.get("prompt"), sort_keys=True) + str(body.get("seed"))
                with server.lock:
                    server.generation_calls += 1
                    if server.keep_bodies:
                        server.bodies.append(body)
                    attempt = server.attempts[key_text] = server.attempts.get(key_text, 0) + 1
                    fault = server.faults.pop(0) if server.faults else None
                    fail = server.fail_next > 0
                    if fail:
                        server.fail_next -= 1
                    slow = server.slow_next > 0
                    if slow:
                        server.slow_next -= 1
                last = (body.get("messages") or [{"content": body.get("prompt", "")}])[-1]["content"]
                if "REJECT" in last:
                    return self._send(400, {"error": {"message": "prompt too long", "type": "BadRequestError"}})
                if fault is None and server.fault_fn is not None:
                    fault = server.fault_fn(body, attempt)
                if fault is not None:
                    with server.lock:
                        server.fault_counts[fault] = server.fault_counts.get(fault, 0) + 1
                if fail or fault == "500":
                    return self._send(500, {"error": {"message": "scripted failure", "type": "InternalServerError"}})
                if slow:
                    time.sleep(server.slow_s)
                n = int(body.get("n", 1))
                if self.path == "/v1/chat/completions":
                    messages = body["messages"]
                    choices = []
                    for i in range(n):
                        text = (server.answer_fn(messages, i, body.get("seed")) if server.answer_fn
                                else answer_for(messages, i))
                        finish = "stop"
                        if body.get("max_tokens") and len(text.split()) > body["max_tokens"]:
                            text, finish = " ".join(text.split()[: body["max_tokens"]]), "length"  # one word a token
                        message = {"role": "assistant", "content": text}
                        if server.reasoning:
                            message["reasoning_content"] = f"thinking about choice {i}"
                        choices.append({"index": i, "message": message, "finish_reason": finish,
                                        "token_ids": list(range(len(text.split())))})
                    prompt_tokens = len(" ".join(m["content"] for m in messages).split())
                    key = messages[-1]["content"]
                else:
                    choices = [{"index": i, "text": body["prompt"][::-1], "finish_reason": "length"}
                               for i in range(n)]
                    prompt_tokens = len(body["prompt"].split())
                    key = body["prompt"]
                out_tokens = sum(len(c.get("message", c).get("content", c.get("text", "")).split()) for c in choices)
                answer = {
                    "id": "cmpl-fake", "object": "chat.completion", "created": int(time.time()),
                    "model": server.model, "choices": choices,
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": out_tokens,
                              "total_tokens": prompt_tokens + out_tokens,
                              "prompt_tokens_details": {"cached_tokens": 0}},
                }
                if fault == "malformed":
                    return self._send(200, json.dumps(answer)[:40])
                if fault == "empty_choices":
                    answer["choices"] = []
                elif fault == "short_choices":
                    answer["choices"] = choices[:-1]
                elif fault == "null_choice":
                    answer["choices"] = [None, *choices[1:]]
                elif fault == "other_model":
                    answer["model"] = "some-other-model"
                elif fault == "no_choices":
                    del answer["choices"]
                elif fault == "usage_negative":
                    answer["usage"]["completion_tokens"] = -3
                elif fault == "usage_huge":
                    answer["usage"]["prompt_tokens"] = 3_957_783_000
                elif fault == "cached_huge":
                    answer["usage"]["prompt_tokens_details"]["cached_tokens"] = prompt_tokens + 10**6
                elif fault == "huge":
                    answer["choices"][0].get("message", answer["choices"][0])["content"] = "x" * HUGE_BYTES
                elif fault in ("trickle", "cut"):
                    return self._send_badly(fault, json.dumps(answer).encode())
                else:
                    with server.lock:
                        server.completed.append(key)
                return self._send(200, answer)

        return Handler
