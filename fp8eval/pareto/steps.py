"""The optional, costly steps of the pareto sweep on its survivors: paired task recovery (`python -m fp8eval`, with a
bootstrap CI) and perf (`python -m fp8eval.perf`: ITL slope, capacity, break-even), each in its own process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def _overrides(cfg, pt: dict) -> list[str]:
    out = [f"model={cfg.model.name}", f"kv={pt['kv']}", f"baseline={cfg.baseline}"]
    if pt["skip"]:
        out.append("kv.engine_args.kv_cache_dtype_skip_layers=[" + ",".join(pt["skip"]) + "]")
    if pt.get("scales"):
        out.append(f"kv.scales={pt['scales']}")
    return out


def _dir_name(key: str) -> str:
    """A directory name for a point that Hydra's override grammar takes (no '=', ',', '|' or brackets)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_")


def _run(args: list[str], log_path: Path) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log:
        return subprocess.run([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT).returncode


def recovery_ci(summary: dict) -> dict:
    """Recovery % and its paired bootstrap 95 % CI from a `python -m fp8eval` summary.json (and its records)."""
    from fp8eval.metrics.pairing import pair_records
    from fp8eval.metrics.stats import paired_bootstrap_recovery
    from fp8eval.records.reader import read_records

    rec = summary.get("recovery") or {}
    out = {"recovery": rec.get("overall"), "n_pairs": rec.get("n_pairs"), "ci_low": None, "ci_high": None}
    arms = summary.get("arms") or {}
    base = summary.get("baseline")
    var = next((n for n in arms if n != base), None)
    if not base or not var or not arms[base].get("records") or not arms[var].get("records"):
        return out
    b_recs, v_recs = read_records(Path(arms[base]["records"])), read_records(Path(arms[var]["records"]))
    paired = pair_records(b_recs, v_recs)
    per_b: dict[str, float] = {}
    per_v: dict[str, float] = {}
    for k in paired.pairs:
        sid = str(b_recs[k.baseline].get("sample_id"))
        per_b[sid] = per_b.get(sid, 0.0) + float(b_recs[k.baseline]["score"])
        per_v[sid] = per_v.get(sid, 0.0) + float(v_recs[k.variant]["score"])
    if len(per_b) >= 2 and sum(per_b.values()) > 0:
        ids = sorted(per_b)
        ci = paired_bootstrap_recovery([per_b[i] for i in ids], [per_v[i] for i in ids])
        out["ci_low"], out["ci_high"] = float(ci.low), float(ci.high)
    return out


def task_recovery(cfg, pt: dict, run_dir: Path, out) -> dict:
    """Run the task paired with the baseline for this point; recovery with its CI, or the error."""
    d = run_dir / "recovery" / _dir_name(pt["key"])
    if (d / "summary.json").exists():
        return recovery_ci(json.loads((d / "summary.json").read_text(encoding="utf-8")))
    extra = list(cfg.pareto.task_overrides)
    engine = [] if any(o.startswith("engine=") for o in extra) else [f"engine={cfg.engine.kind}"]
    args = ["-m", "fp8eval", *_overrides(cfg, pt), f"task={cfg.pareto.task}", *engine, f"hydra.run.dir={d}",
            f"records_dir={d / 'records'}", *extra]
    out(f"pareto: task recovery for {pt['key']}: python {' '.join(args)}")
    rc = _run(args, d / "run.log")
    if rc != 0 or not (d / "summary.json").exists():
        return {"error": f"python -m fp8eval exited {rc}; see {d / 'run.log'}"}
    return recovery_ci(json.loads((d / "summary.json").read_text(encoding="utf-8")))


def _find(obj, key: str):
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            got = _find(v, key)
            if got is not None:
                return got
    return None


def perf(cfg, pt: dict, run_dir: Path, out) -> dict:
    """`python -m fp8eval.perf` for this point: the variant's ITL slope, KV capacity and break-even, or the error."""
    d = run_dir / "perf" / _dir_name(pt["key"])
    if not (d / "perf.json").exists():
        args = ["-m", "fp8eval.perf", *_overrides(cfg, pt), f"hydra.run.dir={d}", *cfg.pareto.perf_overrides]
        out(f"pareto: perf for {pt['key']}: python {' '.join(args)}")
        rc = _run(args, d / "run.log")
        if rc != 0 or not (d / "perf.json").exists():
            return {"error": f"python -m fp8eval.perf exited {rc}; see {d / 'run.log'}"}
    res = json.loads((d / "perf.json").read_text(encoding="utf-8"))
    arm = (res.get("arms") or {}).get(res.get("variant")) or {}
    return {"itl_slope_ms_per_token": _find(arm, "slope_ms_per_token"),
            "kv_capacity_tokens": _find(arm, "kv_capacity_tokens") or _find(arm, "capacity_tokens"),
            "break_even": _find(res, "break_even"), "perf_json": str(d / "perf.json")}
