"""`python -m fp8eval.records check PATH...` and `python -m fp8eval.records repair PATH...`.

PATH is an arm's records file (`<records_dir>/<task>/<fp[:20]>.jsonl`) or a directory searched for them.
`check` lists every line that does not count and why (file:line), and exits 1 when a line is corrupt, not
a record, or belongs to another arm or task. `repair` rewrites each arm's primary file atomically (temp
file, fsync, rename) with exactly the records that count, folds writer segments into it, and moves every
line it drops into `<fp[:20]>.rejected.jsonl` next to it, so nothing is ever lost. It refuses an arm that
a live writer is appending to.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fp8eval.records.claims import Claims
from fp8eval.records.codec import FileScan, canonical_json
from fp8eval.records.reader import arm_files, segment_dir, select_arm

# Reasons that mean the files hold something that should not be there (exit 1 in `check`).
BAD = ("corrupt_line", "not_a_record", "other_arm", "other_task", "torn_tail")
SHOW = 20


def find_arms(paths: list[str]) -> list[Path]:
    """Primary arm files named by, or found under, PATHs."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(q for q in sorted(p.rglob("*.jsonl"))
                       if not q.parent.name.endswith((".seg", ".claims")) and q.with_suffix(".arm.json").exists())
        else:
            raise SystemExit(f"fp8eval.records: {p}: no such file or directory")
    return list(dict.fromkeys(out))


def arm_identity(path: Path) -> tuple[str | None, str]:
    """(full fingerprint from the meta file or None, task = the directory name)."""
    meta = path.with_suffix(".arm.json")
    fp = None
    if meta.exists():
        try:
            fp = json.loads(meta.read_text(encoding="utf-8")).get("fingerprint")
        except ValueError:
            fp = None
    return fp, path.parent.name


def _scan(path: Path) -> list[FileScan]:
    scans = []
    for p in arm_files(path):
        s = FileScan(p)
        s.advance()
        scans.append(s)
    return scans


def check(path: Path) -> tuple[bool, str]:
    """(bad, report) for one arm's records file: what counts, what is ignored and the lines set aside; bad when a line
    is corrupt, not a record, or another arm's or task's."""
    fp, task = arm_identity(path)
    scans = _scan(path)
    view = select_arm(scans, fp, task)
    lines = [f"{path}: {len(view.records)} records count ({sum(r['status'] == 'ok' for r in view.records)} ok, "
             f"{sum(r['status'] == 'error' for r in view.records)} error, "
             f"{sum(r['status'] == 'skipped' for r in view.records)} skipped) in {len(scans)} file(s)"]
    if fp is None:
        lines.append(f"  warning: no {path.with_suffix('.arm.json').name}; the arm fingerprint was not checked")
    if view.ignored:
        lines.append("  ignored: " + ", ".join(f"{k}={v}" for k, v in view.ignored.items()))
    for p in view.problems[:SHOW]:
        lines.append(f"  {p}")
    if len(view.problems) > SHOW:
        lines.append(f"  ... and {len(view.problems) - SHOW} more lines set aside")
    bad = any(view.ignored.get(k) for k in BAD)
    return bad, "\n".join(lines)


def repair(path: Path) -> str:
    """Rewrite one arm's primary file atomically with exactly the records that count, fold its writer segments in and
    append dropped lines to .rejected.jsonl; refused while a writer is alive. Returns a report line."""
    fp, task = arm_identity(path)
    claims = Claims(path.with_suffix(".claims"))
    if claims.writers.is_dir():
        live = [w.stem for w in claims.writers.glob("*.json") if claims.writer_alive(w.stem)]
        if live:
            return f"{path}: not repaired: writer(s) {', '.join(live)} are still appending; rerun when they end"
    scans = _scan(path)
    view = select_arm(scans, fp, task)
    keep = {id(r) for r in view.records}
    rejected: list[str] = []
    for scan in scans:
        raw = scan.path.read_bytes().split(b"\n")
        kept_lines = {line for line, rec in scan.records if id(rec) in keep}
        for i, data in enumerate(raw[:-1] if raw and raw[-1] == b"" else raw, start=1):
            if data.strip() and i not in kept_lines:
                rejected.append(data.decode("utf-8", "replace"))
    if rejected:
        with open(path.with_suffix(".rejected.jsonl"), "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in rejected))
            f.flush()
            os.fsync(f.fileno())
    tmp = path.with_name(f".{path.name}.repair-{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(canonical_json(r) + "\n" for r in view.records))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for seg in arm_files(path)[1:]:
        seg.unlink()  # its records are in the primary file now (a crash before this only duplicates them)
    try:
        segment_dir(path).rmdir()
    except OSError:
        pass
    return (f"{path}: kept {len(view.records)} records; moved {len(rejected)} line(s) to "
            f"{path.with_suffix('.rejected.jsonl').name}" if rejected else f"{path}: kept {len(view.records)} records")


def main(argv: list[str] | None = None) -> int:
    """`python -m fp8eval.records check|repair PATH...`; returns 2 without arms, else 1 when any check finds bad lines
    or any repair is refused, else 0."""
    ap = argparse.ArgumentParser(prog="python -m fp8eval.records", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("check", "repair"))
    ap.add_argument("paths", nargs="+", metavar="PATH")
    args = ap.parse_args(argv)
    arms = find_arms(args.paths)
    if not arms:
        print("fp8eval.records: no arm records found (an arm is <task>/<fp>.jsonl next to <fp>.arm.json)",
              file=sys.stderr)
        return 2
    status = 0
    for path in arms:
        if args.command == "check":
            bad, text = check(path)
            status |= int(bad)
        else:
            text = repair(path)
            status |= int("not repaired" in text)
        print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
