"""Which layers should keep a BF16 KV cache? (issue 16)

`python -m fp8eval.sensitivity model=... kv=fp8` measures, on the shipped long documents, per layer:
the K/V statistics the FP8 cache would see (`kvstats`), the divergence from the BF16 arm when only that
layer's cache is FP8 and when all but that layer are FP8 (`passes`), ranks the layers and picks the
smallest skip list removing `sensitivity.target` of the total divergence (`ranking`), re-measures it, and
writes `sensitivity.json`, a heatmap and a ready kv option (`outputs`).
"""
