"""`python -m fp8eval.records check PATH...` and `python -m fp8eval.records repair PATH...`.

PATH is an arm's records file (`<records_dir>/<task>/<fp[:20]>.jsonl`) or a directory searched for them.
`check` lists every line that does not count and why (file:line), and exits 1 when a line is corrupt, not
a valid record (an impossible score, an unsupported schema, ...), or belongs to another arm or task.
`repair` rewrites each arm's primary file atomically (temp file, fsync, rename; a symlinked file stays a
symlink: its target is rewritten) with exactly the records that count, folds writer segments into it, and
moves every line it drops into `<fp[:20]>.rejected.jsonl` next to it, so nothing is ever lost. It holds the
arm's `arm.repair` claim while it works (a writer that starts meanwhile waits for it) and refuses an arm
that a live writer is appending to. Both stream: memory does not grow with the file. Without the arm's
`.arm.json`, the arm is the one the file name names (records of another fingerprint are not its own).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fp8eval.core.errors import Fp8evalError
from fp8eval.records.claims import Claims
from fp8eval.records.reader import arm_files, arm_score_range, read_arm, segment_dir
from fp8eval.records.store import REPAIR, io_error

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


def arm_identity(path: Path) -> tuple[str, str, bool]:
    """(fingerprint, task = the directory name, whether the .arm.json gave the fingerprint). Without a
    readable .arm.json the fingerprint is the file name's fp[:20], matched as a prefix."""
    meta = path.with_suffix(".arm.json")
    try:
        fp = json.loads(meta.read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        fp = None
    if isinstance(fp, str) and fp:
        return fp, path.parent.name, True
    return path.stem, path.parent.name, False


def check(path: Path) -> tuple[bool, str]:
    """(bad, report) for one arm's records file: what counts, what is ignored and the lines set aside; bad when a line
    is corrupt, not a valid record, or another arm's or task's."""
    fp, task, from_meta = arm_identity(path)
    view = read_arm(path, fp, task, keep=False, notes=True)
    n = view.status_counts()
    lines = [f"{path}: {len(view.where)} records count ({n.get('ok', 0)} ok, {n.get('error', 0)} error, "
             f"{n.get('skipped', 0)} skipped) in {len(arm_files(path))} file(s)"]
    if not from_meta:
        lines.append(f"  warning: no {path.with_suffix('.arm.json').name}; records count when their fingerprint "
                     f"starts with {fp} (the file name)")
    if view.ignored:
        lines.append("  ignored: " + ", ".join(f"{k}={v}" for k, v in view.ignored.items()))
    # every line that does not count, in file order: set aside, another arm's or task's, superseded
    shown = sorted(view.problems, key=lambda p: (str(p.path) != str(path), str(p.path), p.line))[:SHOW]
    for p in shown:
        lines.append(f"  {p}")
    n_not_counted = sum(view.ignored.values())
    if n_not_counted > len(shown):
        lines.append(f"  ... and {n_not_counted - len(shown)} more lines that do not count")
    bad = any(view.ignored.get(k) for k in BAD)
    return bad, "\n".join(lines)


def _lines(f):
    """(line number, byte offset, raw line without newline) of every line of an open binary file, streamed."""
    pos, no = 0, 0
    for raw in f:
        no += 1
        yield no, pos, raw.rstrip(b"\n")
        pos += len(raw)


def repair(path: Path) -> str:
    """Rewrite one arm's primary file atomically with exactly the records that count, fold its writer segments in and
    append dropped lines to .rejected.jsonl, holding the arm's repair claim; refused while a writer is alive.
    Returns a report line."""
    fp, task, _ = arm_identity(path)
    claims = Claims(path.with_suffix(".claims")).register()
    try:
        if not claims.try_claim(REPAIR):
            owner = Claims._owner(claims.dir / REPAIR)
            return f"{path}: not repaired: another repair ({claims.describe(owner or '?')}) holds it; rerun when it ends"
        live = [w.stem for w in claims.writers.glob("*.json")
                if w.stem != claims.writer_id and claims.writer_alive(w.stem)]
        if live:
            who = "; ".join(claims.describe(w) for w in live)
            return f"{path}: not repaired: writer(s) {who} are still appending; rerun when they end"
        return _rewrite(path, fp, task)
    finally:
        claims.close()


def _rewrite(path: Path, fp: str, task: str) -> str:
    files = arm_files(path)
    view = read_arm(path, fp, task, keep=False, score_range=arm_score_range(path))
    keep = {(p, line) for p, line, *_ in view.where}
    rejected_path = path.with_suffix(".rejected.jsonl")
    target = path.resolve()  # a symlinked records file stays a symlink: its target is rewritten
    tmp = target.with_name(f".{target.name}.repair-{os.getpid()}.tmp")
    n_rejected = 0
    try:
        with open(rejected_path, "ab") as rej:
            for p in files:
                try:
                    f = open(p, "rb")
                except FileNotFoundError:
                    continue
                with f:
                    for no, _, raw in _lines(f):
                        if raw.strip() and (p, no) not in keep:
                            rej.write(raw + b"\n")
                            n_rejected += 1
            rej.flush()
            os.fsync(rej.fileno())
        if not n_rejected and rejected_path.stat().st_size == 0:
            rejected_path.unlink()
        handles = {p: open(p, "rb") for p in files if p.exists()}
        try:
            with open(tmp, "wb") as out:
                for p, _, pos, length, _ in view.where:
                    h = handles[p]
                    h.seek(pos)
                    out.write(h.read(length).strip() + b"\n")
                out.flush()
                os.fsync(out.fileno())
        finally:
            for h in handles.values():
                h.close()
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise io_error(e, "repair", Path(e.filename or path)) from None
    for seg in files[1:]:
        seg.unlink(missing_ok=True)  # its records are in the primary file now (a crash before this only duplicates them)
    try:
        segment_dir(path).rmdir()
    except OSError:
        pass
    return (f"{path}: kept {len(view.where)} records; moved {n_rejected} line(s) to {rejected_path.name}"
            if n_rejected else f"{path}: kept {len(view.where)} records")


def main(argv: list[str] | None = None) -> int:
    """`python -m fp8eval.records check|repair PATH...`; returns 2 without arms or when a file cannot be read or
    written, else 1 when any check finds bad lines or any repair is refused, else 0."""
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
        try:
            if args.command == "check":
                bad, text = check(path)
                status |= int(bad)
            else:
                text = repair(path)
                status |= int("not repaired" in text)
        except Fp8evalError as e:
            print(f"fp8eval.records: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"fp8eval.records: {io_error(e, 'read', Path(e.filename or path))}", file=sys.stderr)
            return 2
        print(text)
    return status


if __name__ == "__main__":
    from fp8eval.core.signals import exit_on_sigterm, interrupt_exit_code

    exit_on_sigterm()
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        print("\nfp8eval.records: interrupted; files are replaced atomically, nothing was lost", file=sys.stderr)
        sys.exit(interrupt_exit_code(exc))
