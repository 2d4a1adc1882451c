"""What the installed vLLM says about KV formats, next to fp8eval's table: its version and CacheDType (against
fp8eval.core.kvformats), and vLLM's own KV grouping (fp8eval.feasibility's oracle) for skip lists on SmolLM2 and
gemma3-270m, next to the rule. Run with the vLLM interpreter:

    python scripts/gpu/kvformats_facts.py OUT.json
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project root: run as a script, not -m

from fp8eval.core import kvformats as K  # noqa: E402
from fp8eval.feasibility import Layout, layout_from_config, oracle_many, rule_check  # noqa: E402

# Used when the model's converted config.json is not there yet (the layouts fp8eval reads from it).
FALLBACK = {"gemma3-270m": Layout(tuple("full" if (i + 1) % 6 == 0 else "sliding:512" for i in range(18)), 1, 256),
            "smollm2-135m": Layout(("full",) * 30, 3, 64)}
CASES = {
    "gemma3-270m": [("fp8", ["12", "13", "14", "16", "17"]), ("fp8", ["0", "1", "2", "3", "4"]),
                    ("fp8", ["sliding_window"]), ("fp8", ["5"]), ("fp8", ["5", "11", "17"]), ("fp8", []),
                    *((n, []) for n in K.TQ_PRESETS), ("fp8_per_token_head", []), ("int8_per_token_head", ["0"]),
                    ("int4_per_token_head", ["5"]), ("int4_per_token_head", [])],
    "smollm2-135m": [("fp8", ["0", "29"]), ("turboquant_k8v4", []), ("int4_per_token_head", ["3"])],
}


def layout(model: str) -> tuple[Layout, str]:
    """The model's layout from its converted config.json, else the fallback."""
    try:
        from hydra import compose, initialize_config_dir

        from fp8eval.arms import compose_kv  # noqa: F401  (Hydra config dir)
        from fp8eval.models import local_model_dir

        conf = Path(__file__).resolve().parents[2] / "conf"
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"model={model}"])
        d = Path(local_model_dir(cfg.model))
        return layout_from_config(json.loads((d / "config.json").read_text())), str(d / "config.json")
    except Exception as e:  # noqa: BLE001 - a fact sheet: say where the layout came from
        return FALLBACK[model], f"fallback ({type(e).__name__}: {str(e)[:120]})"


def main() -> int:
    """Write the fact sheet."""
    out: dict = {"fp8eval_formats": sorted(K.FORMATS), "pinned_0_26_0": list(K.PINNED_0_26_0)}
    try:
        import vllm
        from vllm.config.cache import CacheDType

        names = list(typing.get_args(CacheDType))
        out["vllm_version"] = vllm.__version__
        out["cache_dtypes"] = names
        out["missing_from_fp8eval"] = [n for n in names if n not in K.FORMATS]
        out["pinned_but_absent"] = [n for n in K.PINNED_0_26_0 if n not in names]
    except Exception as e:  # noqa: BLE001
        out["vllm_error"] = f"{type(e).__name__}: {e}"
    out["feasibility"] = {}
    for model, cases in CASES.items():
        lay, src = layout(model)
        got = oracle_many(lay, cases, sys.executable)
        rows = []
        for (dtype, skip), v in zip(cases, got):
            r = rule_check(lay, dtype, skip)
            rows.append({"cache_dtype": dtype, "skip": skip, "rule": r.feasible, "rule_reason": r.reason,
                         "oracle": None if v is None else v.feasible, "oracle_reason": None if v is None else v.reason,
                         "agree": None if v is None else v.feasible == r.feasible})
        out["feasibility"][model] = {"layout_source": src, "cases": rows}
    Path(sys.argv[1]).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out.get(k) for k in ("vllm_version", "missing_from_fp8eval", "pinned_but_absent")}))
    for model, f in out["feasibility"].items():
        for r in f["cases"]:
            print(f"{model} {r['cache_dtype']} skip={r['skip']}: rule={r['rule']} oracle={r['oracle']} "
                  f"{(r['oracle_reason'] or '')[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
