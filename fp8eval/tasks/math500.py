"""MATH-500 (the PRM800K test subset of MATH): last \\boxed{}, math-verify equivalence, groups per
subject and per level. Default data: tasks/math500/test.jsonl (see its PROVENANCE.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from fp8eval.scoring.math import last_boxed, quick_math, score_math
from fp8eval.tasks import reasoning_data as rd
from fp8eval.tasks.base import Prompt, Sample, Score, Task
from fp8eval.tasks.reasoning_data import HubTaskConfig


@dataclass
class Math500Config(HubTaskConfig):
    name: str = "math500"
    repeats: int = 5
    dataset: str = "HuggingFaceH4/MATH-500"
    timeout_s: float = 5.0  # per-item limit for math-verify parsing and comparison


class Math500Task(Task):
    name = "math500"
    version = "1"
    config_class = Math500Config
    prompt_varies_by_repeat = False
    parallel_scoring = True

    def samples(self) -> Sequence[Sample]:
        out = []
        for i, row in enumerate(rd.task_rows(self)):
            answer = row.get("answer")
            if answer is None:
                answer = last_boxed(row.get("solution", ""))
            if answer is None or "problem" not in row:
                raise ValueError(f"math500: row {i} has no problem/answer (keys: {sorted(row)})")
            groups = []
            if row.get("subject"):
                groups.append(f"subject={row['subject']}")
            if row.get("level") not in (None, ""):
                groups.append(f"level={row['level']}")
            sid = str(rd.first(row, "unique_id", "id", default=i))
            out.append(Sample(id=sid, data={"problem": row["problem"], "answer": str(answer)}, groups=tuple(groups)))
        return rd.finish_samples(self.name, out)

    def prompt(self, sample: Sample, repeat: int) -> Prompt:
        return rd.user_prompt(self.name, problem=sample.data["problem"])

    def score(self, sample: Sample, completion: str, repeat: int = 0) -> Score:
        return score_math(completion, sample.data["answer"], self.cfg.timeout_s)

    def quick_score(self, sample: Sample, completion: str, repeat: int = 0) -> Score | None:
        return quick_math(completion, sample.data["answer"])

    def fingerprint(self) -> dict[str, Any]:
        return {
            "templates": rd.templates_hash(self.name),
            "data_files": rd.data_files_hash(self.cfg.data_files),
            "scorer": "last_boxed+exact+math_verify(gold first)",
        }
