"""Needle in a haystack (RULER-style multi-key retrieval) over the shipped public-domain books."""

from fp8eval.tasks.niah.task import NiahConfig, NiahTask

__all__ = ["NiahConfig", "NiahTask"]
