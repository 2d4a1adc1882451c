"""The anatomy of a flip: for each (sample, repeat) right in the baseline and wrong in another arm (the FP8
variant, the control), or the reverse, where the two completions part and how the other arm rated the
baseline's token there.

After a run's arms are done, each non-baseline arm with flips is opened once more and every flip not yet
dissected is teacher-forced (`engine.teacher_force`, fp8eval.engines.forcing): the baseline's completion
after the same prompt through that arm. The rows are kept per arm in
`<records_dir>/anatomy/<task>/<arm fingerprint[:20]>.jsonl`, keyed by (sample, repeat) and both
completions' sha256, so a rerun dissects nothing twice and a changed completion is dissected again; the
report joins them to flips.csv.
"""

from __future__ import annotations

import json
import sys

from fp8eval.core.errors import Fp8evalError
from fp8eval.metrics.noise import RIGHT_AT
from fp8eval.metrics.pairing import pair_records
from fp8eval.records.anatomy import load, row_key, store_path


def flips(baseline: list[dict], other: list[dict], right_at: float = RIGHT_AT) -> list[tuple[str, dict, dict]]:
    """(direction, baseline record, other record) for every scored pair right in one arm and wrong in the other:
    "lost" = right in the baseline only, "gained" = right in the other arm only."""
    paired = pair_records(baseline, other)
    out = []
    for k in paired.pairs:
        b, o = baseline[k.baseline], other[k.variant]
        rb, ro = float(b["score"]) >= right_at, float(o["score"]) >= right_at
        if rb != ro:
            out.append(("lost" if rb else "gained", b, o))
    return out


def dissect(views, records_root, request_of, door, task, items, arms, fingerprints: dict[str, str], out=print,
            settle=None) -> dict:
    """Teacher-force every flip of every non-baseline arm not yet dissected, each arm opened through the run's
    `door` (fp8eval.arms); the summary's `anatomy` block ({arm: {flips, computed, reused, errors, unavailable}}).
    `views`: each arm's counted records by name (fp8eval.records.ArmRecords); `records_root`: where the rows are
    kept; `request_of(id, prompt, n, seeds)`: the run's engine request for a prompt. `settle()`, if given, is called
    before an engine is opened (the runner's last engine may still be closing)."""
    by_key = {(it.sample.id, it.repeat): it for it in items}
    base = arms[0]
    summary: dict[str, dict] = {}
    for arm in arms[1:]:
        found = flips(views[base.name].records, views[arm.name].records)
        path = store_path(records_root, task.name, fingerprints[arm.name])
        done = load(path)
        todo = [(d, b, o) for d, b, o in found if row_key(b["sample_id"], b["repeat"], b["completion"],
                                                          o["completion"]) not in done]
        info = {"flips": len(found), "computed": 0, "reused": len(found) - len(todo), "errors": 0,
                "store": str(path)}
        summary[arm.name] = info
        if not todo:
            continue
        if settle is not None:
            settle()
        with door.engine(arm) as engine:
            if not engine.capabilities.teacher_force:
                info["unavailable"] = (f"the {engine.kind} engine cannot teacher-force (its capabilities say so); "
                                       "the flips are listed without their anatomy")
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as fh:
                for direction, b, o in todo:
                    item = by_key.get((b["sample_id"], int(b["repeat"])))
                    row = {"key": row_key(b["sample_id"], b["repeat"], b["completion"], o["completion"]),
                           "sample_id": b["sample_id"], "repeat": int(b["repeat"]), "direction": direction,
                           "baseline_arm": fingerprints[base.name]}
                    try:
                        if item is None or item.prompt is None:
                            raise Fp8evalError("its prompt is not in this run's plan")
                        req = request_of(f"{b['sample_id']}|anatomy", item.prompt, 1, [int(o.get("seed") or 0)])
                        row.update(engine.teacher_force(req, b["completion"] or "", o["completion"] or ""))
                    except (Fp8evalError, ValueError, RuntimeError) as e:  # not kept: the next run retries it
                        info["errors"] += 1
                        info.setdefault("first_error", f"{b['sample_id']}#{b['repeat']}: {type(e).__name__}: {e}"[:300])
                        continue
                    info["computed"] += 1
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                    fh.flush()
        if info["errors"]:
            print(f"warning: {info['errors']} flip(s) of {arm.name} could not be teacher-forced ({path})",
                  file=sys.stderr)
        out(f"anatomy: {info['computed']} flip(s) of {arm.name} teacher-forced through it")
    return summary
