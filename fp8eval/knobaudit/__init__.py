"""The knob audit: what the running engine really uses per attention layer (cache dtype, k/v/q/prob scales,
attention backend), compared with what the arm asked for and with the scales of the checkpoint.

- `compare`: engine-agnostic comparison of a read-back with the request; `AuditError` names the layer and both
  values; `audit.allow=[dtype,scales,backend,skip]` lets an expert run anyway (recorded in the fingerprint).
- `vllm_ext`: the vLLM worker extension (`worker_extension_cls`) that reads the live layers.
- `corpus`: tiny synthetic checkpoints of the known ways a knob silently does not take.
"""
