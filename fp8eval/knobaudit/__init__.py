"""The knob-audit wing: `python -m fp8eval.knobaudit start ...` (one arm: audit, capacity, one request) and
`... corpus DIR` (the regression corpus of tiny checkpoints, `corpus`, each case checked by `check`). The audit
itself lives with the engines (fp8eval.engines.audit), which run it at every start.
"""
