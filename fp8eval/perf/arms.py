"""One server per arm: managed through `fp8eval.engines.server.ServerEngine` (start-up, KV-dtype check,
logs, clean stop) or an already-running one (`engine.base_urls.<kv>=URL`), plus its KV capacity."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fp8eval.arms import ArmEngines, ArmSpec
from fp8eval.engines.server import ServerEngine, parse_cache_config_info

PERF_MODELS_DIR = Path(__file__).resolve().parents[2] / "conf" / "perf_models"
_LOG_CAPACITY = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens")


class PerfError(RuntimeError):
    """The perf run cannot proceed; the message says why and what to do."""


def dummy_config_dir(model_name: str, configured: str | None) -> Path:
    """The directory holding the config.json that dummy weights are built from."""
    path = Path(configured).expanduser() if configured else PERF_MODELS_DIR / model_name
    if not (path / "config.json").is_file():
        shipped = sorted(p.name for p in PERF_MODELS_DIR.iterdir() if (p / "config.json").is_file())
        raise PerfError(f"perf.dummy_weights=true needs a config.json in {path}; shipped: {', '.join(shipped)} "
                        "(or set perf.config_dir=DIR)")
    return path


def perf_cfg(cfg, dummy: bool) -> Any:
    """The run config the arm's server is built from: prefix caching off (unless asked), and for dummy
    weights the shipped config.json with random weights and no tokenizer."""
    cfg = copy.deepcopy(cfg)
    extra = dict(cfg.engine.engine_args)
    urls = {k: v for k, v in (cfg.engine.base_urls or {}).items() if v}
    lists = sorted(k for k, v in urls.items() if not isinstance(v, str))
    if lists:
        raise PerfError(f"engine.base_urls.{lists[0]} lists several servers: latency is measured on one "
                        "server per arm; give one URL")
    managed = not (cfg.engine.base_url or urls)
    if not cfg.perf.prefix_caching:
        # Managed: --no-enable-prefix-caching. External: only declared (the server decides; the prompts
        # are fresh random ids, so no request hits a cache anyway).
        extra.setdefault("enable_prefix_caching", False)
    if dummy:
        config_dir = dummy_config_dir(cfg.model.name, cfg.perf.config_dir)
        cfg.model = replace(cfg.model, hf_id=str(config_dir), revision=None, embedded_package=None,
                            gguf_file=None, tokenizer=None)
        extra.setdefault("load_format", "dummy")
        extra.setdefault("skip_tokenizer_init", True)
    cfg.engine = replace(cfg.engine, engine_args=extra,
                         served_model_name=cfg.engine.served_model_name or (cfg.model.name if managed else None))
    return cfg


def capacity_from(labels: dict[str, str] | None, log_text: str) -> dict[str, Any]:
    """KV capacity in tokens. Two readings: num_gpu_blocks x block_size (vllm:cache_config_info; all an
    external server tells) and vLLM's own start-up figure ("GPU KV cache size: N tokens", managed servers).
    They agree for uniform models; for hybrid ones (sliding-window layers: Gemma 3, gpt-oss) blocks are
    shared across layer groups and only the log's figure counts tokens, so `tokens` is the log's when
    there is one (`source` says which)."""
    out: dict[str, Any] = {"num_gpu_blocks": None, "block_size": None, "tokens": None, "log_tokens": None,
                           "blocks_x_block_size": None, "source": None}
    if labels:
        try:
            out["num_gpu_blocks"] = int(labels["num_gpu_blocks"])
            out["block_size"] = int(labels["block_size"])
            out["blocks_x_block_size"] = out["num_gpu_blocks"] * out["block_size"]
        except (KeyError, ValueError, TypeError):
            pass
    found = _LOG_CAPACITY.findall(log_text or "")
    if found:
        out["log_tokens"] = int(found[-1].replace(",", ""))
    if out["log_tokens"] is not None:
        out["tokens"], out["source"] = out["log_tokens"], "vLLM start-up log"
    elif out["blocks_x_block_size"] is not None:
        out["tokens"], out["source"] = out["blocks_x_block_size"], "num_gpu_blocks x block_size"
    return out


def model_vocab(model_path: str | None, configured: int | None) -> int:
    """Vocabulary size for random token-id prompts: perf.vocab_size, else the model directory's config.json,
    else 32000 (every model this project knows has at least that many ids)."""
    if configured:
        return int(configured)
    try:
        conf = json.loads((Path(str(model_path)) / "config.json").read_text())
        conf = conf if "vocab_size" in conf else conf.get("text_config", {})
        return int(conf["vocab_size"])
    except (OSError, KeyError, ValueError, TypeError):
        return 32000


@dataclass
class Arm:
    name: str
    engine: ServerEngine
    url: str
    model_id: str
    max_model_len: int
    capacity: dict[str, Any]
    server: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    door: ArmEngines | None = None

    def close(self) -> None:
        """Close the arm's server engine (through the door that opened it)."""
        if self.door is not None:
            self.door.close(self.engine)
        else:
            self.engine.close()


def open_arm(door: ArmEngines, arm: ArmSpec) -> Arm:
    """Start (or attach to) the arm's server through the door (`fp8eval.arms.open_engines(cfg, kind="server")`)
    and read what it runs; raises EngineError when it cannot."""
    engine = door.open(arm)
    if not isinstance(engine, ServerEngine):
        door.close(engine)
        raise PerfError(f"arm {arm.name}: perf measures one server per arm, got {type(engine).__name__}")
    kv = arm
    labels = None
    line = engine.cache_config_info_line
    if line:
        labels = parse_cache_config_info(line)
    log_path = engine.log_path
    log_text = Path(log_path).read_text(errors="replace") if log_path and Path(log_path).is_file() else ""
    tokenizer = None
    if not engine.args.get("skip_tokenizer_init"):
        tokenizer = str(engine.args.get("tokenizer") or engine.args.get("model") or "") or None
    return Arm(kv.name, engine, engine.root, engine.model_id, engine.max_model_len(), capacity_from(labels, log_text),
               server={"preflight": engine.preflight, "log": str(log_path) if log_path else None,
                       "mode": "managed" if engine.managed else "external"}, tokenizer=tokenizer, door=door)
