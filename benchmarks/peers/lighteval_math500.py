"""lighteval 0.13.0 custom task `math500_local`: its shipped `math_500` task
(lighteval/tasks/tasks/math_500.py: same prompt function, same pass@k math metric) with only

- the dataset source changed to the local MATH-500 folder (default: tasks/math500 of this repo, whose only
  split-named data file is test.jsonl; override with MATH500_DATA_DIR), so nothing is fetched from the hub;
- the metric's n raised from 1 to MATH500_REPEATS (default 5): pass@k with k=1, n=5, i.e. every one of the
  5 samples per problem is scored by lighteval's math extractive match and the mean is reported.

By hand, from the repo root (see benchmarks/peers/lighteval_dummy_model.py for the model):
    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 lighteval custom dummy benchmarks/peers/lighteval_dummy_model.py \
        "math500_local|0" --custom-tasks benchmarks/peers/lighteval_math500.py --save-details
"""

import copy
import dataclasses
import os
from pathlib import Path

from lighteval.metrics.metrics import Metrics
from lighteval.tasks.tasks.math_500 import math_500 as _shipped

DATA_DIR = os.environ.get("MATH500_DATA_DIR") or str(Path(__file__).resolve().parents[2] / "tasks" / "math500")
REPEATS = int(os.environ.get("MATH500_REPEATS", "5"))

# Metrics.__call__ mutates the shared enum value in place: work on a copy, with the base name restored.
_metric = copy.deepcopy(Metrics.pass_at_k_math.value)
_metric.metric_name = "pass@k"
_metric = _metric(sample_params={"k": 1, "n": REPEATS})

math500_local = dataclasses.replace(
    _shipped, name="math500_local", hf_repo=DATA_DIR, hf_subset="default", metrics=[_metric]
)

TASKS_TABLE = [math500_local]
