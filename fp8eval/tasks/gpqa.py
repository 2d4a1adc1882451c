"""GPQA-Diamond: four-option multiple choice, options shuffled per (record id, repeat, seed).

The data is gated on the hub (`Idavidrein/gpqa`, config gpqa_diamond) and its authors ask that no
example be published: nothing of it is stored in this repository, and files with its content must stay
out of git. Offline, pass a local copy of the CSV with `task.data_files=[...]`.

The choice order differs between repeats, so the gold letter depends on the repeat: `score()` takes it
as a keyword (`repeat=`); the runner passes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from fp8eval.scoring.mcq import choice_order, correct_letter, score_mcq
from fp8eval.tasks import reasoning_data as rd
from fp8eval.tasks.base import Prompt, Sample, Score, Task
from fp8eval.tasks.reasoning_data import HubTaskConfig

_COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


@dataclass
class GpqaConfig(HubTaskConfig):
    name: str = "gpqa_diamond"
    repeats: int = 5
    dataset: str = "Idavidrein/gpqa"
    dataset_config: Optional[str] = "gpqa_diamond"
    split: str = "train"


class GpqaTask(Task):
    name = "gpqa_diamond"
    version = "1"
    config_class = GpqaConfig
    prompt_varies_by_repeat = True

    def samples(self) -> Sequence[Sample]:
        out = []
        for i, row in enumerate(rd.task_rows(self)):
            missing = [c for c in _COLUMNS + ("Record ID",) if not row.get(c)]
            if missing:
                raise ValueError(f"gpqa_diamond: row {i} lacks columns {missing}")
            options = [str(row[c]).strip() for c in _COLUMNS[1:]]
            domain = row.get("High-level domain")
            out.append(Sample(
                id=str(row["Record ID"]),
                data={"question": str(row["Question"]).strip(), "options": options},
                groups=(f"domain={domain}",) if domain else (),
            ))
        return rd.finish_samples(self.name, out)

    def _order(self, sample: Sample, repeat: int) -> list[int]:
        return choice_order(sample.id, repeat, self.ctx.seed)

    def prompt(self, sample: Sample, repeat: int) -> Prompt:
        shown = [sample.data["options"][j] for j in self._order(sample, repeat)]
        return rd.user_prompt(self.name, question=sample.data["question"],
                              A=shown[0], B=shown[1], C=shown[2], D=shown[3])

    def score(self, sample: Sample, completion: str, repeat: int | None = None) -> Score:
        if repeat is None:
            raise TypeError("gpqa_diamond.score needs repeat= (the choice order depends on it)")
        return score_mcq(completion, correct_letter(self._order(sample, repeat)))

    def fingerprint(self) -> dict[str, Any]:
        return {
            "templates": rd.templates_hash(self.name),
            "data_files": rd.data_files_hash(self.cfg.data_files),
            "choice_order": "fp8eval.seeds.permutation(4, record_id, repeat, seed)",
            "scorer": "last letter (Answer:/boxed/answer is)",
        }
