"""The one place numbers are made from records.

select (exactly one record per (sample, repeat)) < arm (score, stderr, groups of one arm) and pairing
(two arms joined on (sample, repeat) with the prompt-hash check, recovery) < stats (bootstrap CIs, sign
tests, the stderr rule) and auc (Context Arena's AUC over MRCR's bins); groups orders labels. The
summary, the terminal table and the report all call these functions, so they can never disagree.
"""

from fp8eval.metrics.auc import context_arena_auc

__all__ = ["context_arena_auc"]
