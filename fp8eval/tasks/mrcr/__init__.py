"""MRCR (openai/mrcr): multi-round co-reference over long conversations, graded as the official
grader does, bucketed by o200k tokens, with Context Arena's AUC. Data, synthesis and the tokenizer are
private to this task."""

from fp8eval.tasks.mrcr.task import MrcrConfig, MrcrTask

__all__ = ["MrcrConfig", "MrcrTask"]
