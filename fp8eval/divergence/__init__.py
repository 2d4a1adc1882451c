"""Divergence of an arm's next-token distributions from its baseline's (issue 18), on the decode or prefill kernel path
or both (issue 35, fp8eval.divergence.paths).

`python -m fp8eval.divergence` (see `fp8eval.divergence.__main__`); the pure measures live in
`fp8eval.divergence.measures`.
"""
