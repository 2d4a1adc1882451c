"""`python -m fp8eval.pareto`: formats x skip lists x calibration on one frontier; prints the pick's `vllm serve`
line and the run directory last."""

from __future__ import annotations

import sys
from pathlib import Path

from fp8eval.core.errors import Fp8evalError
from fp8eval.pareto.config import ParetoRunConfig
from fp8eval.registry import register_wing
from fp8eval.wing import hydra_wing


def register() -> None:
    """ConfigStore: the shared groups and `pareto_schema` (conf/pareto.yaml)."""
    register_wing("pareto_schema", ParetoRunConfig)


register()


def format_table(result: dict) -> str:
    """The points, frontier marked, then the pick and its serve line."""
    lines = [f"{'':2}{'configuration':58} {'B/token':>8} {'x BF16':>7} {'KL':>10}  note"]
    for p in sorted(result["points"], key=lambda q: q["kv_bytes_per_token"]):
        kl = "-" if p.get("kl") is None else f"{p['kl']:.3e}"
        note = (f"same cache as {p['same_as']}" if p.get("same_as") else
                "infeasible: " + p["feasibility"].get("reason", "") if not p["feasible"] else (p.get("error") or ""))
        if p.get("needs"):
            note = (note + "; " if note else "") + f"needs {p['needs']}"
        mark = "* " if p.get("on_frontier") else "  "
        lines.append(f"{mark}{p['key'][:58]:58} {p['kv_bytes_per_token']:>8} {p['capacity_vs_bf16']:>7.2f} {kl:>10}  "
                     f"{note[:90]}")
    lines.append(f"pick: {result['pick'] or '-'} ({result['pick_reason']})")
    if result.get("serve"):
        lines.append(result["serve"])
    if result.get("serve_note"):
        lines.append(result["serve_note"])
    return "\n".join(lines)


def run_wing(cfg: ParetoRunConfig, run_dir: Path) -> None:
    """Run the sweep, print the table and the run directory (an fp8eval error or a ValueError: one line, exit 2)."""
    from fp8eval.pareto.sweep import run

    result = run(cfg, run_dir, out=lambda s: print(s, file=sys.stderr))
    print(format_table(result))
    print(run_dir)


main = hydra_wing("fp8eval.pareto", "pareto", run_wing, errors=(Fp8evalError, ValueError))


if __name__ == "__main__":
    main()
