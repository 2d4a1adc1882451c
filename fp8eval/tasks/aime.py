"""AIME 2025 (`aime25`), AIME 2024 (`aime24`) and AIME 2022-2025 pooled (`aime`, 120 problems): integer
answers 0-999 in the last \\boxed{}.

Default data: the copies in tasks/aime25 and tasks/aime24 (see their PROVENANCE.md); with
`task.data_files=null` the hub dataset is loaded instead. The pooled task buys questions rather than repeats
(docs/statistics.md: between-question variance shrinks only with questions): from the hub it reads
AI-MO/aimo-validation-aime (2022-2024, 90 problems) and math-ai/aime25 (30); offline, any files holding those
years (the repo ships 2024 and 2025: 60 problems). Each problem's id is `<year>-<I|II>-<number>` and its
group `year=<year>`; a problem whose year, contest or number cannot be read is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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


@dataclass
class AimePooledConfig(AimeConfig):
    name: str = "aime"
    repeats: int = 8
    dataset: str = "AI-MO/aimo-validation-aime"  # 2022-2024 (90 problems); math-ai/aime25 adds 2025
    split: str = "train"
    dataset_2025: str = "math-ai/aime25"
    years: list[int] = field(default_factory=lambda: [2022, 2023, 2024, 2025])  # the years kept


_URL = re.compile(r"(\d{4})_AIME_(I{1,2})_Problems/Problem_(\d+)")


def year_contest_number(row: dict) -> tuple[int, str, int] | None:
    """(year, "I" | "II", problem number) of an AIME row: from its `year`/`contest`/`problem_number` fields
    (tasks/aime25) or its AoPS `url` (aime24, AI-MO/aimo-validation-aime); None when neither says."""
    m = _URL.search(str(row.get("url") or ""))
    if m:
        return int(m.group(1)), m.group(2), int(m.group(3))
    year, contest, number = row.get("year"), str(row.get("contest") or ""), row.get("problem_number")
    part = contest.replace("AIME", "").strip()
    if year is not None and part in ("I", "II") and number is not None:
        return int(year), part, int(number)
    return None


class AimePooledTask(AimeTask):
    name = "aime"
    config_class = AimePooledConfig

    def _rows(self) -> list[dict]:
        """The local files' rows, else the two hub datasets' (2022-2024, then 2025)."""
        if self.cfg.data_files:
            return rd.task_rows(self)
        return (rd.load_hub(self.name, self.cfg.dataset, None, self.cfg.split, self.cfg.revision)
                + rd.load_hub(self.name, self.cfg.dataset_2025, None, "test", None))

    def samples(self) -> Sequence[Sample]:
        out = []
        for i, row in enumerate(self._rows()):
            problem = rd.first(row, "problem", "question", "Problem", "Question")
            answer = rd.first(row, "answer", "Answer")
            where = year_contest_number(row)
            if problem is None or answer is None or where is None:
                raise ValueError(f"{self.name}: row {i} has no problem/answer or no year, contest and number"
                                 f" (fields year/contest/problem_number or an AoPS url; keys: {sorted(row)})")
            year, part, number = where
            if year not in self.cfg.years:
                continue
            out.append(Sample(id=f"{year}-{part}-{number}", groups=(f"year={year}",),
                              data={"problem": problem, "answer": int(str(answer).strip())}))
        return rd.finish_samples(self.name, out)
