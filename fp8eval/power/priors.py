"""Per-task priors for power planning when no pilot records exist (assumptions, stated as such).

Each prior gives the variance components of a paired per-record difference (metrics.power.Variance) and
a baseline score (for a recovery floor). Sampled tasks (temperature > 0, repeats): the arms' answers to
one question are modelled as independent draws, sigma2_w = 2 E[p_i (1 - p_i)] and omega2 = 0 (Miller
2024's K-repeat term); E[p(1-p)] per task is the value the issue's MDEs were computed with (AIME .10,
GPQA-D .12, MATH-500 .04, LCB .10), not a measurement. Greedy tasks (one repeat): each record flips with
probability `flip` independently (sigma2_w = flip), clustering not modelled. A pilot replaces all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8eval.metrics.power import Variance


@dataclass(frozen=True)
class Prior:
    variance: Variance
    baseline_score: float  # an assumed mean score of the BF16 arm, for a recovery floor
    samples: int | None  # the dataset's size when the task cannot say without loading it


def _sampled(pq: float, base: float, n: int | None, what: str) -> Prior:
    return Prior(Variance(0.0, 2.0 * pq, f"prior: sampled, E[p(1-p)] = {pq:g} per arm ({what})"), base, n)


def _greedy(flip: float, base: float, what: str, binary: bool = True) -> Prior:
    return Prior(Variance(0.0, flip, f"prior: greedy, a record's difference has variance {flip:g} ({what})",
                          binary), base, None)


PRIORS: dict[str, Prior] = {
    "aime25": _sampled(0.10, 0.5, 30, "AIME 2025, 30 problems"),
    "aime24": _sampled(0.10, 0.5, 30, "AIME 2024, 30 problems"),
    "gpqa_diamond": _sampled(0.12, 0.6, 198, "GPQA Diamond, 198 questions"),
    "math500": _sampled(0.04, 0.9, 500, "MATH-500"),
    "livecodebench": _sampled(0.10, 0.5, 175, "LiveCodeBench v6 as the issue counts it"),
    "niah": _greedy(0.05, 0.9, "5 % of needles flip either way"),
    "mrcr": _greedy(0.02, 0.5, "per-row score difference sd 0.14", binary=False),
    "lm_eval": _greedy(0.05, 0.6, "5 % of items flip either way"),
}


def prior_for(task: str) -> Prior:
    """The prior of a task (KeyError naming the tasks that have one)."""
    if task not in PRIORS:
        raise KeyError(f"no prior for task {task!r} (priors: {', '.join(sorted(PRIORS))}); give pilot records"
                       " with power.pilot=[<run dir>]")
    return PRIORS[task]
