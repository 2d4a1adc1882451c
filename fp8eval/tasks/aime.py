"""AIME 2025 (`aime25`) and AIME 2024 (`aime24`): integer answers 0-999 in the last \\boxed{}.

Default data: the copies in tasks/aime25 and tasks/aime24 (see their PROVENANCE.md); with
`task.data_files=null` the hub dataset is loaded instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from fp8eval.scoring.math import score_aime
from fp8eval.tasks import reasoning_data as rd
from fp8eval.tasks.base import Prompt, Sample, Score, Task
from fp8eval.tasks.reasoning_data import HubTaskConfig


@dataclass
class AimeConfig(HubTaskConfig):
    name: str = "aime25"
    repeats: int = 10
    dataset: str = "math-ai/aime25"
    timeout_s: float = 5.0  # per-item limit for the math-verify fallback


@dataclass
class Aime24Config(AimeConfig):
    name: str = "aime24"
    dataset: str = "HuggingFaceH4/aime_2024"
    split: str = "train"


class AimeTask(Task):
    name = "aime25"
    version = "1"
    config_class = AimeConfig
    prompt_varies_by_repeat = False

    def samples(self) -> Sequence[Sample]:
        out = []
        for i, row in enumerate(rd.task_rows(self)):
            problem = rd.first(row, "problem", "question", "Problem", "Question")
            answer = rd.first(row, "answer", "Answer")
            if problem is None or answer is None:
                raise ValueError(f"{self.name}: row {i} has no problem/answer field (keys: {sorted(row)})")
            sid = str(rd.first(row, "id", "ID", "unique_id", default=i))
            groups = (f"contest={row['contest']}",) if row.get("contest") else ()
            out.append(Sample(id=sid, data={"problem": problem, "answer": int(str(answer).strip())}, groups=groups))
        return rd.finish_samples(self.name, out)

    def prompt(self, sample: Sample, repeat: int) -> Prompt:
        return rd.user_prompt(self.name, problem=sample.data["problem"])

    def score(self, sample: Sample, completion: str, repeat: int = 0) -> Score:
        return score_aime(completion, sample.data["answer"], self.cfg.timeout_s)

    def fingerprint(self) -> dict[str, Any]:
        return {
            "templates": rd.templates_hash(self.name),
            "data_files": rd.data_files_hash(self.cfg.data_files),
            "scorer": "last_boxed+int0-999+math_verify",
        }


class Aime24Task(AimeTask):
    name = "aime24"
    config_class = Aime24Config
