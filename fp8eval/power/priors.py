"""Per-task priors for power planning when no pilot records exist (assumptions, stated as such).

Each prior gives the variance components of a paired per-record difference (metrics.power.Variance) and
a baseline score (for a recovery floor). Sampled tasks (temperature > 0, repeats): the arms' answers to
one question are modelled as independent draws around the question's own rate, sigma2_w = 2 E[p_i (1 - p_i)]
(Miller 2024's K-repeat term), and the question's true paired difference varies across questions,
omega2 = OMEGA2 (issue 36: repeats of one question are correlated, so omega2 = 0 would promise that repeats
can replace questions; Miller 2024, "Adding error bars to evals", sec. 3-4, and Madaan et al. 2024,
"Quantifying variance in evaluation benchmarks", report such question-level correlation). The values are
assumptions, not measurements: E[p(1-p)] as the issue's MDEs were computed with (AIME .10, GPQA-D .12,
MATH-500 .04, LCB .10); OMEGA2 = 0.01 (a per-question difference sd of 10 points), the value with which
AIME 2022-25 pooled (120) x 8 detects about 4.8 points and AIME25 x 32 about 6.5 at the same 960
generations (issue 36's estimate). `prior_range` spans sd 5 to 15 points. Greedy tasks (one repeat): each
record flips with probability `flip` independently (sigma2_w = flip), clustering not modelled; range flip / 2
to 2 flip. A pilot replaces all of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fp8eval.metrics.power import Variance

OMEGA2 = 0.01  # between-question variance of the true paired difference (sd 10 points), sampled tasks
OMEGA2_RANGE = (0.0025, 0.0225)  # sd 5 .. 15 points


@dataclass(frozen=True)
class Prior:
    variance: Variance
    baseline_score: float  # an assumed mean score of the BF16 arm, for a recovery floor
    samples: int | None  # the dataset's size when the task cannot say without loading it


def _sampled(pq: float, base: float, n: int | None, what: str) -> Prior:
    return Prior(Variance(OMEGA2, 2.0 * pq, f"prior: sampled, E[p(1-p)] = {pq:g} per arm, between-question"
                          f" difference sd {OMEGA2 ** 0.5:g} ({what})"), base, n)


def _greedy(flip: float, base: float, what: str, binary: bool = True) -> Prior:
    return Prior(Variance(0.0, flip, f"prior: greedy, a record's difference has variance {flip:g} ({what})",
                          binary), base, None)


PRIORS: dict[str, Prior] = {
    "aime25": _sampled(0.10, 0.5, 30, "AIME 2025, 30 problems"),
    "aime24": _sampled(0.10, 0.5, 30, "AIME 2024, 30 problems"),
    "aime": _sampled(0.10, 0.5, 120, "AIME 2022-2025 pooled, 120 problems"),
    "gpqa_diamond": _sampled(0.12, 0.6, 198, "GPQA Diamond, 198 questions"),
    "math500": _sampled(0.04, 0.9, 500, "MATH-500"),
    "livecodebench": _sampled(0.10, 0.5, 175, "LiveCodeBench v6 as the issue counts it"),
    "niah": _greedy(0.05, 0.9, "5 % of needles flip either way"),
    "mrcr": _greedy(0.02, 0.5, "per-row score difference sd 0.14", binary=False),
    "lm_eval": _greedy(0.05, 0.6, "5 % of items flip either way"),
}


def prior_range(prior: Prior) -> tuple[Variance, Variance]:
    """The prior's low and high variance (module docstring): omega2 over OMEGA2_RANGE for a sampled task, the
    flip rate halved and doubled for a greedy one."""
    v = prior.variance
    if v.omega2 > 0:
        return tuple(dataclasses.replace(v, omega2=w, source=v.source + f" (omega2 {w:g})") for w in OMEGA2_RANGE)
    return tuple(dataclasses.replace(v, sigma2_w=v.sigma2_w * f, source=v.source + f" (x {f:g})") for f in (0.5, 2.0))


def prior_for(task: str) -> Prior:
    """The prior of a task (KeyError naming the tasks that have one)."""
    if task not in PRIORS:
        raise KeyError(f"no prior for task {task!r} (priors: {', '.join(sorted(PRIORS))}); give pilot records"
                       " with power.pilot=[<run dir>]")
    return PRIORS[task]
