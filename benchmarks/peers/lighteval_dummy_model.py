"""lighteval 0.13.0's dummy model (lighteval/models/dummy/dummy_model.py) made runnable from the CLI:
`lighteval custom <name> <this file> <tasks>` (the CLI has no other way to pick DummyModelConfig).

Two changes, both needed for the MATH-500 x 5 job:
- `lighteval custom` hands the model a CustomModelConfig; we build the DummyModelConfig it expects, with the
  response cache in LIGHTEVAL_DUMMY_CACHE_DIR when set (so a timed run reuses nothing);
- the shipped greedy_until returns one text per doc whatever doc.num_samples is; this one returns
  doc.num_samples copies of the same constant junk text, so an n=5 metric gets its 5 samples.
"""

import os

from lighteval.models.dummy import dummy_model as _dummy
from lighteval.models.model_output import ModelResponse
from lighteval.tasks.requests import SamplingMethod
from lighteval.utils.cache_management import cached


class DummyModel(_dummy.DummyModel):
    def __init__(self, config):
        cache_dir = os.environ.get("LIGHTEVAL_DUMMY_CACHE_DIR") or config.cache_dir
        super().__init__(_dummy.DummyModelConfig(model_name=config.model_name, cache_dir=cache_dir))

    @cached(SamplingMethod.GENERATIVE)
    def greedy_until(self, docs):
        return [ModelResponse(text=["random baseline"] * max(1, doc.num_samples)) for doc in docs]
