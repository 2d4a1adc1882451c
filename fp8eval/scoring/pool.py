"""Scoring off the runner's loop: costly answers are scored in worker processes while the next completions
arrive, and completions are handed back in arrival order so each one's records are still appended in
one write.

Only tasks that declare `parallel_scoring` use workers (MATH-500: math-verify costs milliseconds per
answer). Even then each answer first gets the task's `quick_score` in the runner's process (last box,
exact and integer matches: microseconds, cheaper than the round trip to a worker); only the answers it
cannot decide go to the pool, which is forked on the first such answer. Workers inherit the task object
and score in their main thread, where the scorers' per-item timeouts are SIGALRM timers. A completion's
costly answers go to one worker together, so its gold answer is parsed by one process, once.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from fp8eval.core.procs import scoring_worker_init
from fp8eval.core.types import Sample, Score


class Task(Protocol):
    """What the pool needs of a task (`fp8eval.tasks.base.Task` is one): its pure scorer and cheap check."""

    def score(self, sample: Sample, completion: str, repeat: int = 0) -> Score:
        """Pure: the score of one answer."""

    def quick_score(self, sample: Sample, completion: str, repeat: int = 0) -> Score | None:
        """score() when it is cheap to know, else None."""

# The task the forked workers score with (set before the pool forks; workers never change it).
_TASK: Task | None = None


def _score_batch(items: list[tuple[Sample, str, int]]) -> list[Score]:
    return [_TASK.score(sample, answer, repeat=repeat) for sample, answer, repeat in items]


def auto_workers(task: Task, requested: int | None) -> int:
    """`requested` if given; else the usable cores for tasks that declare parallel_scoring, else 0."""
    if requested is not None:
        return max(0, int(requested))
    if not getattr(task, "parallel_scoring", False) or not hasattr(os, "fork"):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores if cores >= 2 else 0


@dataclass
class _Waiting:
    key: Any
    scores: list[Score | None]
    future: Future | None = None
    slots: tuple[int, ...] = ()  # positions in `scores` the future fills

    def ready(self) -> bool:
        return self.future is None or self.future.done()

    def result(self) -> list[Score]:
        if self.future is not None:
            for i, score in zip(self.slots, self.future.result(), strict=True):
                self.scores[i] = score
        return self.scores


class Scorer:
    """submit(key, items) then collect finished (key, scores) in submission order.

    workers == 0 scores everything inline at submit. `window` bounds how many completions may wait for
    scores: a run killed meanwhile loses at most those (resent on the rerun, like requests in flight)."""

    def __init__(self, task: Task, workers: int, window: int = 64):
        self.task = task
        self.workers = workers
        self.window = window
        self._pending: deque[_Waiting] = deque()
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            global _TASK
            _TASK = self.task
            # Workers die with the runner on any signal, SIGKILL included (fp8eval.core.procs).
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"),
                                             initializer=scoring_worker_init, initargs=(os.getpid(),))
        return self._pool

    def submit(self, key: Any, items: list[tuple[Sample, str, int]]) -> None:
        """Queue one key's (sample, completion, repeat) items: scored inline without workers, else quick_score first and
        the rest sent to the worker pool."""
        if self.workers <= 0:
            self._pending.append(_Waiting(key, [self.task.score(s, a, repeat=r) for s, a, r in items]))
            return
        scores = [self.task.quick_score(s, a, repeat=r) for s, a, r in items]
        slots = tuple(i for i, sc in enumerate(scores) if sc is None)
        future = self._executor().submit(_score_batch, [items[i] for i in slots]) if slots else None
        self._pending.append(_Waiting(key, scores, future, slots))

    def finished(self) -> Iterator[tuple[Any, list[Score]]]:
        """What is ready now, in order; blocks only while more than `window` completions wait."""
        while self._pending and (self._pending[0].ready() or len(self._pending) > self.window):
            w = self._pending.popleft()
            yield w.key, w.result()

    def drain(self) -> Iterator[tuple[Any, list[Score]]]:
        """Yield (key, scores) for every submitted key, in submission order, waiting on workers as needed."""
        while self._pending:
            w = self._pending.popleft()
            yield w.key, w.result()

    def close(self) -> None:
        """Shut the worker pool down (pending work cancelled). Safe to call twice."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
