"""`python -m fp8eval.power`: how much evaluation a paired FP8-vs-BF16 comparison needs (issue 22).

For a task or a suite and a target (a drop in points, or a recovery floor), alpha and power: the samples x
repeats needed, the minimum detectable drop of the run as planned, and the cost of the powered run through
the dry-run estimator (`fp8eval.plan`). Variances come from pilot records of the two arms when given
(`power.pilot=[run dirs]`), else from the stated per-task priors (`fp8eval.power.priors`). Formulas:
`fp8eval.metrics.power`, docs/statistics.md.
"""
