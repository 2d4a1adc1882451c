"""LiveCodeBench code generation (release_v6 by default, problems dated start_date to end_date, both included).

Hub: the jsonl files of `livecodebench/code_generation_lite` are downloaded directly (the dataset's
loading script is not run: recent `datasets` no longer run scripts). release_vN is test.jsonl plus
test2..testN.jsonl. Local files (`task.data_files`) may lack `private_test_cases`; such a run uses the
public tests only and says so in its notes: it is then not an official LiveCodeBench score.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from fp8eval.config import TaskConfig
from fp8eval.tasks.base import Prompt, Sample, Score, Task


@dataclass
class LiveCodeBenchConfig(TaskConfig):
    name: str = "livecodebench"
    repeats: int = 10
    dataset: str = "livecodebench/code_generation_lite"
    version_tag: str = "release_v6"
    revision: Optional[str] = None
    # The model cards' "v6 (25.02-25.05)". As the official filter (lcb_runner load_code_generation_dataset):
    # start_date <= contest_date <= end_date, the dates read as midnight.
    start_date: Optional[str] = "2025-02-01"
    end_date: Optional[str] = "2025-05-01"
    timeout_s: float = 6.0  # per test, as the official runner


def release_files(version_tag: str) -> list[str]:
    """The dataset's JSONL files that make up a release tag: release_vN is test.jsonl, test2.jsonl, ..., testN.jsonl."""
    n = int(version_tag.removeprefix("release_v"))
    return ["test.jsonl"] + [f"test{i}.jsonl" for i in range(2, n + 1)]


def in_window(contest_date, start: str | None, end: str | None) -> bool:
    """The official date filter: start <= contest_date <= end, with start and end at midnight (a contest at
    00:00 on the end date is in, one later that day is out, exactly as lcb_runner compares datetimes)."""
    from datetime import datetime

    text = str(contest_date or "")
    try:
        when = datetime.fromisoformat(text).replace(tzinfo=None)
    except ValueError:
        when = datetime.strptime(text[:10], "%Y-%m-%d") if len(text) >= 10 else None
    if when is None:
        return start is None and end is None
    if start and when < datetime.strptime(start, "%Y-%m-%d"):
        return False
    return not (end and when > datetime.strptime(end, "%Y-%m-%d"))


class LiveCodeBenchTask(Task):
    name = "livecodebench"
    # 2: verdicts as the official evaluator gives them (docs/sandbox.md) and the end date included.
    version = "2"
    config_class = LiveCodeBenchConfig
    prompt_varies_by_repeat = False

    def _rows(self) -> list[dict]:
        from fp8eval.tasks import reasoning_data as rd

        cfg = self.cfg
        if cfg.data_files:
            return rd.load_local(cfg.data_files)
        rows: list[dict] = []
        for filename in release_files(cfg.version_tag):
            rows.extend(rd.read_rows(rd.hub_file(self.name, cfg.dataset, filename, cfg.revision)))
        return rows

    def samples(self) -> Sequence[Sample]:
        from fp8eval.scoring.code import decode_tests

        cfg = self.cfg
        out = []
        self._public_only = False
        for row in self._rows():
            if not in_window(row.get("contest_date"), cfg.start_date, cfg.end_date):
                continue
            public = decode_tests(row.get("public_test_cases"))
            private = decode_tests(row.get("private_test_cases"))
            if not private:
                self._public_only = True
            tests = public + private
            if not tests:
                raise ValueError(f"livecodebench: {row.get('question_id')} has no tests")
            metadata = row.get("metadata") or "{}"
            metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
            testtype = tests[0].get("testtype", "functional" if row.get("starter_code") else "stdin")
            out.append(Sample(
                id=str(row["question_id"]),
                data={
                    "question": row["question_content"],
                    "starter_code": row.get("starter_code") or "",
                    "tests": [{"input": t["input"], "output": t["output"]} for t in tests],
                    "testtype": testtype,
                    "func_name": metadata.get("func_name"),
                },
                groups=(f"difficulty={row.get('difficulty')}", f"platform={row.get('platform')}"),
            ))
        if not out:
            raise ValueError(f"livecodebench: no problems dated {cfg.start_date} to {cfg.end_date} (inclusive)")
        out.sort(key=lambda s: s.id)
        return out

    def prompt(self, sample: Sample, repeat: int) -> Prompt:
        from fp8eval.tasks import reasoning_data as rd

        if sample.data["starter_code"]:
            fmt = rd.render(rd.read_template(self.name, "format_functional.txt"),
                            starter_code=sample.data["starter_code"])
        else:
            fmt = rd.read_template(self.name, "format_stdin.txt")
        user = rd.render(rd.read_template(self.name), question=sample.data["question"], format=fmt.rstrip("\n"))
        system = rd.read_template(self.name, "system.txt").strip()
        return Prompt(messages=({"role": "system", "content": system}, {"role": "user", "content": user}))

    def score(self, sample: Sample, completion: str, repeat: int = 0) -> Score:
        from fp8eval.scoring.code import score_code

        d = sample.data
        return score_code(completion, d["tests"], d["testtype"], d["func_name"], self.cfg.timeout_s)

    def fingerprint(self) -> dict[str, Any]:
        from fp8eval.scoring import sandbox
        from fp8eval.tasks import reasoning_data as rd

        return {
            "templates": rd.templates_hash(self.name),
            "data_files": rd.data_files_hash(self.cfg.data_files),
            "sandbox": {"memory_mb": sandbox.DEFAULT_MEMORY_MB, "output_limit": sandbox.DEFAULT_OUTPUT_LIMIT_BYTES,
                        "prelude_sha": __import__("hashlib").sha256(sandbox.PRELUDE.encode()).hexdigest()[:16]},
        }

    def notes(self) -> list[str]:
        if getattr(self, "_public_only", False):
            return ["livecodebench: public tests only (no private_test_cases in the data): "
                    "not an official LiveCodeBench score"]
        return []
