"""Can vLLM serve this skip list? Checked before a skip list is recommended or run.

vLLM gives every attention layer a KV cache spec (attention type, page bytes) and, for a model with more than
one attention type (gemma3: sliding-window and full layers), groups layers and unifies their page sizes
(vllm/v1/core/kv_cache_utils.py: `get_kv_cache_groups` -> `unify_kv_cache_spec_page_size`, which asserts
`new_spec.page_size_bytes == max_page_size`). A skip list keeps some layers in BF16 (twice the bytes of FP8), so
it can put different page sizes into one attention type.

Two checks; a list is feasible only when both say so (the H200 showed each missing a case the other caught):

- **oracle** (whenever a vLLM is importable, FP8EVAL_VLLM_PYTHON or this interpreter): the layers' specs are built
  as vLLM builds them (type, KV heads, head size, cache dtype; the format's packed bytes) and vLLM's own
  `get_kv_cache_groups` is called on them, in a subprocess, in about 20 s (vLLM's import). No model is loaded.
- **rule** (no vLLM here): what vLLM 0.26.0 did on the H200 -- gemma3-270m `[12,13,14,16,17]` failed with that
  assertion, `[0,1,2,3,4]` and `[sliding_window]` started -- and what its code says:
  1. a model with one attention type (all full attention: SmolLM2, Llama) puts every layer into one group
     (`UniformTypeKVCacheSpecs`): any skip list is feasible;
  2. a hybrid model: every page size must divide the largest (block sizes are scaled by the ratio), and the
     full-attention layers must all keep one cache format (a skip list that keeps some full-attention layers in
     BF16 and others not failed); mixing formats among sliding-window layers started.
  3. (H200, 2026-12-03) TurboQuant finds no backend on a model with sliding-window layers; int4_per_token_head on
     a hybrid model fails at start (pages that cannot be padded), which vLLM's grouping also says.
  The rule explains these observations and nothing more; a start on the GPU settles a case.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field

from fp8eval.core.kvformats import TQ_PRESETS, bytes_per_token_layer, effective_skip_layers


@dataclass(frozen=True)
class Layout:
    """A model's attention layers as vLLM's KV specs see them."""

    types: tuple[str, ...]  # per layer: "full" or "sliding:<window>"
    n_kv_heads: int
    head_dim: int

    @property
    def hybrid(self) -> bool:
        """More than one attention type."""
        return len(set(self.types)) > 1


def layout_from_config(cfg: dict) -> Layout:
    """The layout of a transformers config.json dict (text config of a multimodal model included)."""
    c = cfg.get("text_config") or cfg
    n = int(c["num_hidden_layers"])
    heads = int(c.get("num_key_value_heads") or c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    window = c.get("sliding_window")
    types = c.get("layer_types")
    if types and len(types) == n:
        out = tuple(f"sliding:{window}" if "sliding" in str(t) else "full" for t in types)
    elif window and c.get("use_sliding_window", True):
        out = (f"sliding:{window}",) * n
    else:
        out = ("full",) * n
    return Layout(out, heads, head_dim)


@dataclass
class Verdict:
    feasible: bool
    how: str  # "rule" | "oracle"
    reason: str = ""
    pages: dict = field(default_factory=dict)  # attention type -> {page bytes per token: [layers]}

    def as_dict(self) -> dict:
        """JSON form."""
        return {"feasible": self.feasible, "how": self.how, "reason": self.reason, "pages": self.pages}


def layer_formats(layout: Layout, cache_dtype: str, skip: list) -> list[str]:
    """Each layer's cache dtype under this skip list (plus the format's own boundary layers): the format, or
    "bfloat16" for a kept layer."""
    eff = set(effective_skip_layers(cache_dtype, list(skip or []), len(layout.types)))
    out = []
    for i, t in enumerate(layout.types):
        kept = str(i) in eff or ("sliding_window" in eff and t.startswith("sliding"))
        out.append("bfloat16" if kept or cache_dtype in ("auto", "bfloat16") else cache_dtype)
    return out


def pages(layout: Layout, cache_dtype: str, skip: list) -> dict[str, dict[int, list[int]]]:
    """Attention type -> page bytes per token -> the layers with that page."""
    out: dict[str, dict[int, list[int]]] = {}
    for i, (t, f) in enumerate(zip(layout.types, layer_formats(layout, cache_dtype, skip))):
        b = bytes_per_token_layer(f, layout.n_kv_heads, layout.head_dim)
        out.setdefault(t, {}).setdefault(b, []).append(i)
    return out


def rule_check(layout: Layout, cache_dtype: str, skip: list) -> Verdict:
    """The rule in the module docstring (no vLLM needed)."""
    pg = pages(layout, cache_dtype, skip)
    show = {t: {str(b): ls for b, ls in d.items()} for t, d in pg.items()}
    sliding = any(t.startswith("sliding") for t in layout.types)
    if cache_dtype in TQ_PRESETS and sliding:
        # not a page-size question: vLLM 0.26.0 picks no backend (TURBOQUANT: "sliding window not supported"; H200)
        return Verdict(False, "rule", "TurboQuant on a model with sliding-window layers: vLLM 0.26.0 finds no "
                                      "attention backend (TURBOQUANT: sliding window not supported)", show)
    if not layout.hybrid:
        return Verdict(True, "rule", "one attention type: one KV group, any skip list", show)
    if cache_dtype == "int4_per_token_head" and any(f == cache_dtype for f in layer_formats(layout, cache_dtype, skip)):
        # H200, vLLM 0.26.0, gemma3-270m with no skip list: the start fails reshaping the cache, and vLLM's grouping
        # says why: a page that does not divide the largest cannot be padded on TRITON_ATTN
        return Verdict(False, "rule", "int4_per_token_head on a hybrid model: vLLM 0.26.0 cannot pad its pages "
                                      "(TRITON_ATTN does not index KV pages by block stride); the start failed", show)
    sizes = {b for d in pg.values() for b in d}
    top = max(sizes)
    bad = sorted(b for b in sizes if top % b)
    if bad:
        return Verdict(False, "rule", f"page bytes/token {bad} do not divide the largest ({top}): vLLM cannot unify "
                                      f"the page sizes by block size", show)
    full = pg.get("full", {})
    if len(full) > 1:
        desc = "; ".join(f"{b} B/token: layers {ls}" for b, ls in sorted(full.items()))
        return Verdict(False, "rule", f"full-attention layers in more than one cache format ({desc}): vLLM 0.26.0 "
                                      f"failed start-up with `assert new_spec.page_size_bytes == max_page_size`", show)
    return Verdict(True, "rule", "full-attention layers share one format; page sizes divide the largest", show)


_ORACLE = r'''
import dataclasses, json, sys, types
import torch
payload = json.loads(sys.stdin.read())
from vllm.v1 import kv_cache_interface as K
from vllm.v1.core import kv_cache_utils as U
try:
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE as DT
except ImportError:
    from vllm.utils import STR_DTYPE_TO_TORCH_DTYPE as DT
mode_of = getattr(K, "get_kv_quant_mode", None)
ns = types.SimpleNamespace
for spec_in in payload:
    specs = {}
    for i, (t, f, content) in enumerate(zip(spec_in["types"], spec_in["formats"], spec_in["content"])):
        cls = K.SlidingWindowSpec if t.startswith("sliding") else K.FullAttentionSpec
        names = {x.name for x in dataclasses.fields(cls)}
        kw = dict(block_size=16, num_kv_heads=spec_in["heads"], head_size=spec_in["head_dim"],
                  dtype=torch.bfloat16 if f == "bfloat16" else DT[f])
        if "head_size_v" in names: kw["head_size_v"] = spec_in["head_dim"]
        if t.startswith("sliding"): kw["sliding_window"] = int(t.split(":")[1])
        if "kv_quant_mode" in names and mode_of and f != "bfloat16": kw["kv_quant_mode"] = mode_of(f)
        if "state_content_bytes" in names and content: kw["state_content_bytes"] = content
        if "cache_dtype_str" in names: kw["cache_dtype_str"] = f
        specs[f"model.layers.{i}.self_attn.attn"] = cls(**{k: v for k, v in kw.items() if k in names})
    cfg = ns(scheduler_config=ns(disable_hybrid_kv_cache_manager=False),
             cache_config=ns(get_resolved_kv_cache_layout=lambda: ns(is_block_outermost=False),
                             cache_dtype=spec_in["dtype"], kv_cache_dtype_skip_layers=[]),
             model_config=ns(hf_config=ns(), hf_text_config=ns()), speculative_config=None, kv_transfer_config=None)
    try:
        groups = U.get_kv_cache_groups(cfg, specs)
        print(json.dumps({"ok": True, "groups": len(groups)}))
    except AttributeError as e:
        print(json.dumps({"ok": None, "error": f"{type(e).__name__}: {e}"[:400]}))
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}))
'''


def oracle_many(layout: Layout, cases: list[tuple[str, list]], python: str,
                timeout_s: float = 600) -> list[Verdict | None]:
    """vLLM's own grouping for each (cache_dtype, skip list) on this layout, in one subprocess (None for a case,
    or all of them, when that vLLM cannot be run or cannot build the specs)."""
    payload = []
    for cache_dtype, skip in cases:
        formats = layer_formats(layout, cache_dtype, skip)
        content = [0 if f in ("bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2") else
                   bytes_per_token_layer(f, layout.n_kv_heads, layout.head_dim) // layout.n_kv_heads for f in formats]
        payload.append({"types": list(layout.types), "formats": formats, "content": content, "dtype": cache_dtype,
                        "heads": layout.n_kv_heads, "head_dim": layout.head_dim})
    try:
        r = subprocess.run([python, "-c", _ORACLE], input=json.dumps(payload), capture_output=True, text=True,
                           timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return [None] * len(cases)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if len(lines) != len(cases):
        return [None] * len(cases)
    out: list[Verdict | None] = []
    for (cache_dtype, skip), line in zip(cases, lines):
        got = json.loads(line)
        show = {t: {str(b): ls for b, ls in d.items()} for t, d in pages(layout, cache_dtype, skip).items()}
        if got["ok"] is None:  # this vLLM's grouping needs more of its config than the oracle builds
            out.append(None)
        elif got["ok"]:
            out.append(Verdict(True, "oracle", f"vLLM's get_kv_cache_groups made {got['groups']} group(s)", show))
        else:
            out.append(Verdict(False, "oracle", f"vLLM's get_kv_cache_groups: {got['error']}", show))
    return out


def oracle_check(layout: Layout, cache_dtype: str, skip: list, python: str) -> Verdict | None:
    """vLLM's own grouping for one skip list (None when the oracle cannot say)."""
    return oracle_many(layout, [(cache_dtype, skip)], python)[0]


def _both(oracle: Verdict | None, rule: Verdict) -> Verdict:
    """Feasible only if neither says no: vLLM's grouping accepted lists whose start then failed on the H200
    (gemma3 fp8 [12,13,14,16,17] and [5] fail later, in unify_kv_cache_spec_page_size; TurboQuant at backend
    selection), and the rule missed one the grouping refused (int4_per_token_head on gemma3)."""
    if oracle is None:
        return rule
    if oracle.feasible and not rule.feasible:
        return Verdict(False, "rule", rule.reason + " (vLLM's grouping alone accepts it; the start does not)",
                       rule.pages)
    return oracle


def check_many(layout: Layout, cases: list[tuple[str, list]], python: str | None = None) -> list[Verdict]:
    """check() for many cases with one vLLM start."""
    got = oracle_many(layout, cases, python) if python else [None] * len(cases)
    return [_both(g, rule_check(layout, c, s)) for g, (c, s) in zip(got, cases)]


def check(layout: Layout, cache_dtype: str, skip: list, python: str | None = None) -> Verdict:
    """Feasible when the rule and, where `python` (a vLLM interpreter) works, vLLM's own grouping both say so."""
    return _both(oracle_check(layout, cache_dtype, skip, python) if python else None,
                 rule_check(layout, cache_dtype, skip))
