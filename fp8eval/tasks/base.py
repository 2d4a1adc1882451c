"""What a task is: samples, the prompt for each (sample, repeat), a pure scorer, and groups.

A task module stays light at import time (stdlib only at the top; heavy libraries inside functions),
because every task's config dataclass is imported to register it with Hydra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

from fp8eval.config import TaskConfig
from fp8eval.core.filehash import file_sha256  # noqa: F401 - the tasks' way to name their data by content
from fp8eval.core.paths import PROJECT_ROOT, TASK_DATA_ROOT  # noqa: F401 - re-exported for tasks
from fp8eval.core.types import Prompt, Sample, Score  # noqa: F401 - the task API's types


@dataclass
class TaskContext:
    """What a task may know of the model, without knowing the engine."""

    count_tokens: Callable[[Prompt], int]  # tokens of the prompt under the model's chat template
    max_model_len: int
    model_name: str
    seed: int
    # The effective output budget of every request (prompt + this must fit); None outside the runner.
    max_tokens: int | None = None
    # count_tokens of several prompts at once (the engine may tokenize them in one batch, in parallel); the
    # same numbers as count_tokens one by one. None outside the runner: Task.prepare then does nothing.
    count_many: Callable[[list[Prompt]], list[int]] | None = None


class SkipSample(Exception):
    """Raised by Task.prompt when a sample cannot be posed to this model; recorded as skipped."""


class Task:
    name: ClassVar[str]
    # Bump when data selection, prompt or scoring changes: it is part of the arm fingerprint.
    version: ClassVar[str] = "1"
    config_class: ClassVar[type[TaskConfig]] = TaskConfig
    # True when the prompt differs between repeats (e.g. GPQA choice order); otherwise all repeats
    # of a sample share one request with n samples, so one prefill serves them all.
    prompt_varies_by_repeat: ClassVar[bool] = False
    # Config keys that only choose which samples run (a grid's lengths, a row limit), not what any one
    # sample's prompt or score is: they stay out of the arm fingerprint, so a larger grid reuses the
    # records of a smaller one. Each reused record's prompt hash is still checked.
    selection_keys: ClassVar[tuple[str, ...]] = ()
    # True when score() costs enough (math-verify: milliseconds an answer) that scoring in worker
    # processes beats a process pool's start-up (fp8eval.scoring.pool).
    parallel_scoring: ClassVar[bool] = False
    # Every score this task can give lies in this closed range (None: any finite number, for a metric chosen
    # by the user). The records store refuses, and the reader never counts, a score outside it (or NaN/inf).
    score_range: ClassVar[tuple[float, float] | None] = (0.0, 1.0)

    def __init__(self, cfg: TaskConfig, ctx: TaskContext):
        self.cfg = cfg
        self.ctx = ctx

    # --- to implement -------------------------------------------------------------------------
    def samples(self) -> Sequence[Sample]:
        """Every sample of the task, in a fixed order (the data selection the config asks for)."""
        raise NotImplementedError

    def prompt(self, sample: Sample, repeat: int) -> Prompt:
        """The prompt of one (sample, repeat); raises SkipSample when the sample cannot be posed to this model."""
        raise NotImplementedError

    def score(self, sample: Sample, completion: str, repeat: int = 0) -> Score:
        """Pure. `repeat` matters only to tasks whose prompt varies by repeat (GPQA's choice order)."""
        raise NotImplementedError

    # --- optional -----------------------------------------------------------------------------
    def limit_samples(self, samples: Sequence[Sample]) -> list[Sample]:
        """The samples a run does under `task.limit` (the runner calls this on `samples()`; a task never
        applies the limit itself). Default: the first `limit` in `samples()` order, all when it is null.
        Override for another rule (MRCR: the first `limit` of each (needles, bucket) cell)."""
        limit = getattr(self.cfg, "limit", None)
        return list(samples)[:limit] if limit else list(samples)

    def prepare(self, samples: Sequence[Sample]) -> None:
        """Called by the runner before it asks `prompt()` for `samples`: a task whose prompts need many token
        counts (NIAH fits each haystack to a length) may count them here in batches with `ctx.count_many`
        and keep the prompts; `prompt()` must then return exactly what it would have built alone. Default:
        nothing."""

    def quick_score(self, sample: Sample, completion: str, repeat: int = 0) -> Score | None:
        """score() when it is cheap to know, else None. With parallel_scoring, answers that get None here
        are the only ones sent to the scoring workers (their IPC costs more than a cheap check)."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        """Everything besides the prompts themselves that can change a number: data revision,
        prompt template hash, scoring options. The task's config (minus repeats/limit) is added."""
        return {}

    def summarize(self, arm_summary: dict[str, Any], records: list[dict]) -> dict[str, Any]:
        """Extra task metrics for an arm's summary (e.g. MRCR's AUC). Records are that arm's."""
        return {}

    @staticmethod
    def cluster_of(sample_id: str, groups: tuple[str, ...]) -> str:
        """The statistical unit a record belongs to (fp8eval.metrics.verdict, docs/statistics.md): records
        of one cluster move together in every CI and power estimate. Default: the sample (its repeats).
        Tasks whose samples share context (NIAH's cells share one haystack) return something coarser."""
        return sample_id

    def notes(self) -> list[str]:
        """Lines to show the user about this run (e.g. 'grid capped at the model's 8k context')."""
        return []

