"""Issue 23, scale: the rerun's validated index (fp8eval.records.index) and the orjson fast path give exactly
what a full json scan gives, and a stale or tampered index is never trusted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fp8eval.records import ArmStore, read_arm
from fp8eval.records import codec as codec_mod
from fp8eval.records import index as index_mod
from fp8eval.records.codec import FileScan
from fp8eval.records.index import IndexedScan, StaleIndex, index_path
from fp8eval.records.reader import Selection, feed

FP = "c" * 64


def rec(sid, repeat=0, score=1.0, status="ok", **kw) -> dict:
    out = {"schema": 2, "arm": FP, "task": "t", "sample_id": sid, "repeat": repeat, "status": status,
           "score": score if status == "ok" else None, "prompt_hash": f"h{sid}", "groups": ["g"],
           "time": "2026-12-01T00:00:00+00:00", "completion": f"answer {sid}"}
    out.update(kw)
    return out


def lines(n, start=0) -> list[str]:
    out = [json.dumps(rec(f"s{i}", score=float(i % 2))) for i in range(start, start + n)]
    out[1:1] = ["not json", '{"schema": 2}', json.dumps(rec("x", arm="d" * 64)), ""]
    out.append(json.dumps(rec("s0", score=0.0, time="2026-12-02T00:00:00+00:00")))  # supersedes s0
    return out


def write(path: Path, text_lines: list[str], mode="w") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode, encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in text_lines))


def arm(tmp_path, n=40) -> Path:
    path = tmp_path / "t" / f"{FP[:20]}.jsonl"
    write(path, lines(n))
    path.with_suffix(".arm.json").write_text(json.dumps({"fingerprint": FP, "material": {}}))
    return path


EXPECTED = {(f"s{i}", 0): f"hs{i}" for i in range(0, 60, 3)}


def indexed(path: Path, expected=EXPECTED, save=True):
    """The ArmRecords through an IndexedScan (saving its index), and the scan."""
    scan = IndexedScan(path, (0.0, 1.0))
    sel = Selection(FP, "t", expected)
    assert feed(path, [scan], sel)
    view = sel.result([scan])
    if save:
        scan.save(min_new=0)
    return view, scan


def same(a, b) -> None:
    assert a.records == b.records
    assert a.ignored == b.ignored
    assert [str(p) for p in a.problems] == [str(p) for p in b.problems]
    assert a.where == b.where
    assert a.n_by_status == b.n_by_status


def full(path: Path, expected=EXPECTED):
    return read_arm(path, FP, "t", expected, score_range=(0.0, 1.0))


def parsed_lines(monkeypatch) -> list:
    """Every line the scanners parse from now on (to tell an index's use from a full scan)."""
    seen: list = []
    orig = FileScan._parse

    def spy(self, raw, line, pos, emit):
        seen.append(line)
        return orig(self, raw, line, pos, emit)

    monkeypatch.setattr(FileScan, "_parse", spy)
    return seen


def test_index_used_and_exact_after_appends(tmp_path, monkeypatch):
    path = arm(tmp_path)
    first, scan = indexed(path)
    same(first, full(path))
    assert index_path(path).exists() and scan.indexed_end == path.stat().st_size
    old_lines = len(lines(40))
    write(path, lines(20, start=40), mode="a")  # new lines, a corrupt one among them
    seen = parsed_lines(monkeypatch)
    view, scan = indexed(path, save=False)
    assert scan.indexed_end > 0  # the index was trusted
    # parsed: every appended line, and of the indexed ones only the winners (read from their lines)
    assert {n for n in seen if n > old_lines} == set(range(old_lines + 1, old_lines + len(lines(20)) + 1))
    assert {n for n in seen if n <= old_lines} == {w[1] for w in view.where if w[1] <= old_lines}
    monkeypatch.undo()
    same(view, full(path))
    assert view.ignored["outside_selection"] > 0 and view.ignored["corrupt_line"] == 2
    assert scan.save(min_new=0)  # the index rewritten over both parts: the next read parses nothing new
    again, scan = indexed(path, save=False)
    assert scan.indexed_end == path.stat().st_size
    same(again, full(path))


def test_truncated_file_is_read_whole(tmp_path):
    path = arm(tmp_path)
    indexed(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2].rsplit(b"\n", 1)[0] + b"\n")
    view, scan = indexed(path, save=False)
    assert scan.indexed_end == 0
    same(view, full(path))
    # truncated, then written past the old end with other lines: the digest does not match
    write(path, lines(40, start=100), mode="a")
    view, scan = indexed(path, save=False)
    assert scan.indexed_end == 0
    same(view, full(path))


def test_rewritten_line_of_the_same_size_is_not_trusted(tmp_path):
    path = arm(tmp_path)
    before, _ = indexed(path)
    data = path.read_bytes()
    old = json.dumps(rec("s3", score=1.0)).encode()
    new = json.dumps(rec("s3", score=0.0)).encode()
    assert len(old) == len(new) and data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    view, scan = indexed(path, save=False)
    assert scan.indexed_end == 0
    same(view, full(path))
    assert [r["score"] for r in view.records if r["sample_id"] == "s3"] == [0.0] != \
        [r["score"] for r in before.records if r["sample_id"] == "s3"]


def test_appended_torn_line_counts_as_torn(tmp_path):
    path = arm(tmp_path)
    indexed(path)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec("s6", score=0.0))[:30])
    view, scan = indexed(path, save=False)
    assert scan.indexed_end > 0
    same(view, full(path))
    assert view.ignored["torn_tail"] == 1


def test_tampered_or_foreign_index_is_ignored(tmp_path):
    path = arm(tmp_path)
    indexed(path)
    raw = index_path(path).read_bytes()
    body, _, digest = raw.rstrip(b"\n").rpartition(b"\n")
    # an edited row (its digest no longer matches)
    index_path(path).write_bytes(body.replace(b'"hs3"', b'"hs4"', 1) + b"\n" + digest + b"\n")
    view, scan = indexed(path, save=False)
    assert scan.indexed_end == 0
    same(view, full(path))
    # a whole index with another score range, or cut short
    index_path(path).write_bytes(raw)
    other = IndexedScan(path, None)
    assert other._read_doc() is None and IndexedScan(path, (0.0, 1.0))._read_doc() is not None
    index_path(path).write_bytes(raw[: len(raw) // 2])
    assert IndexedScan(path, (0.0, 1.0))._read_doc() is None


def test_index_of_other_rules_is_ignored(tmp_path, monkeypatch):
    path = arm(tmp_path)
    indexed(path)
    assert IndexedScan(path, (0.0, 1.0))._read_doc() is not None
    monkeypatch.setattr(index_mod, "_RULES", ["made by other parsing or validation code"])
    view, scan = indexed(path, save=False)
    assert scan.indexed_end == 0
    same(view, full(path))


def test_stale_winner_line_raises_and_the_store_reads_whole(tmp_path, monkeypatch):
    path = arm(tmp_path)
    indexed(path)
    scan = IndexedScan(path, (0.0, 1.0))
    sel = Selection(FP, "t", EXPECTED)
    assert feed(path, [scan], sel) and scan.indexed_end > 0
    data = path.read_bytes()  # rewritten in place between the index's check and the winners' read
    path.write_bytes(data.replace(b'"hs3"', b'"hs9"'))
    with pytest.raises(StaleIndex):
        sel.result([scan])
    path.write_bytes(data)
    scan = IndexedScan(path, (0.0, 1.0))
    sel = Selection(FP, "t", EXPECTED)
    assert feed(path, [scan], sel) and scan.indexed_end > 0
    tmp = path.with_name("copy")  # replaced by a copy of itself (as repair does): another inode
    tmp.write_bytes(data)
    tmp.replace(path)
    with pytest.raises(StaleIndex):
        sel.result([scan])
    calls = []
    orig = IndexedScan.load

    def stale_once(self, stub, where):
        calls.append(where)
        if len(calls) == 1:
            raise StaleIndex("test")
        return orig(self, stub, where)

    monkeypatch.setattr(IndexedScan, "load", stale_once)
    store = ArmStore(tmp_path, "t", FP, {}).open()
    try:
        view = store.read(EXPECTED)
    finally:
        store.close()
    assert len(calls) == 1  # the second pass read every line, no index
    same(view, full(path))


def test_store_writes_the_index_past_the_threshold(tmp_path, monkeypatch):
    path = arm(tmp_path)
    store = ArmStore(tmp_path, "t", FP, {}).open()
    try:
        store.read(EXPECTED)
    finally:
        store.close()
    assert not index_path(path).exists()  # a small arm: no index
    monkeypatch.setattr(index_mod, "MIN_NEW_BYTES", 1)
    store = ArmStore(tmp_path, "t", FP, {}).open()
    try:
        first = store.read(EXPECTED)
    finally:
        store.close()
    assert index_path(path).exists()
    store = ArmStore(tmp_path, "t", FP, {}).open()
    try:
        again = store.read(EXPECTED)
        assert all(s.indexed_end > 0 for s in store._view[1].values() if s.path == path)
    finally:
        store.close()
    same(first, again)
    same(again, full(path))


# --- orjson and json agree on every line -------------------------------------------------------------
TRICKY = [
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 123456789012345678901234567890, '
    '"status": "ok", "score": 1.0}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": 99999999999999999999, "repeat": 0, "status": "ok", '
    '"score": 1.0}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": 1.0, '
    '"score_details": {"n": 18446744073709551616, "m": [1, [2, 36893488147419103232]]}}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": NaN}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": 1e400}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "\\ud800", "repeat": 0, "status": "ok", "score": 1}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "repeat": 1, "status": "ok", '
    '"score": 0.30000000000000004}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "é", "repeat": -0, "status": "ok", "score": 1.0E-0}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": 1} \x0c',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": 1}\r',
    ' {"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": 1}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": 1} x',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s\x01", "repeat": 0, "status": "ok", "score": 1}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", '
    '"score": 0.1000000000000000055511151231257827}',
    '{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", "score": 1.0, '
    '"latency_s": 9.3e18}',
    '[1, 2]', '{"a": 1}', "{", "",
]


def scan_all(path: Path) -> tuple[list, dict, list]:
    got: list = []
    s = FileScan(path, None)
    s.advance(lambda line, r, pos, n: got.append((line, repr(r), pos, n)))
    return got, s.counts, [str(p) for p in s.problems]


@pytest.mark.parametrize("ascii_only", [True, False])
def test_orjson_and_json_give_the_same_records(tmp_path, monkeypatch, ascii_only):
    orjson = pytest.importorskip("orjson")
    path = tmp_path / "a.jsonl"
    floats = [repr(x) for x in (0.1, 1 / 3, 2.5e-308, 5e-324, 1.7976931348623157e308, 123456.789e3)]
    extra = ['{"schema": 2, "arm": "A", "task": "t", "sample_id": "s", "repeat": 0, "status": "ok", '
             f'"score": 0.5, "x": {f}}}' for f in floats]
    text = [t for t in TRICKY + extra if not ascii_only or t.isascii()]
    path.write_bytes(("\n".join(text) + "\n").encode("utf-8") + b'{"bad utf8": "\xff"}\n')
    calls = []
    real = orjson.loads
    monkeypatch.setattr(codec_mod, "orjson", type("O", (), {"loads": staticmethod(
        lambda t: (calls.append(1), real(t))[1])}))
    fast = scan_all(path)
    assert calls  # the fast path ran
    monkeypatch.setattr(codec_mod, "orjson", None)
    slow = scan_all(path)
    assert fast == slow
    reprs = [r for _, r, _, _ in slow[0]]
    assert any("123456789012345678901234567890" in r for r in reprs)  # a big int stays an int
    assert slow[1]["corrupt_line"] >= 3 and slow[1]["not_a_record"] >= 2


def test_orjson_matches_json_on_generated_records(tmp_path, monkeypatch):
    pytest.importorskip("orjson")
    import random

    rnd = random.Random(7)
    path = tmp_path / "b.jsonl"
    recs = [rec(f"s{i}", score=rnd.random(), latency_s=rnd.uniform(0, 1e3) * 10 ** rnd.randint(-300, 10),
                seed=rnd.randint(0, 2**62), completion="".join(chr(rnd.randint(32, 0x2FF)) for _ in range(20)))
            for i in range(500)]
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(recs)),
                    encoding="utf-8")
    fast = scan_all(path)
    monkeypatch.setattr(codec_mod, "orjson", None)
    assert fast == scan_all(path)
    assert len(fast[0]) == 500 and all(not math.isnan(r["score"]) for r in recs)
