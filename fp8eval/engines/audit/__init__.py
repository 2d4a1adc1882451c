"""The knob audit inside the engines: what each attention layer of the running engine really uses (cache dtype,
k/v/q/prob scales, attention backend), compared with what the arm asked for and with the scales of the checkpoint.

- `compare`: engine-agnostic comparison of a read-back with the request; `AuditError` names the layer and both
  values; `audit.allow=[dtype,scales,backend,skip]` lets an expert run anyway (recorded in the fingerprint).
- `vllm_ext`: the vLLM worker extension (`worker_extension_cls`) that reads the live layers.
- `live`: the audit of a started vLLM engine and of the reference engine's policy.
- `reference`: the reference engine's read-back and the static checkpoint lint.

The wing `python -m fp8eval.knobaudit` (start one arm, the regression corpus) builds on this.
"""
