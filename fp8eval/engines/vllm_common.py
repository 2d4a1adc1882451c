"""Compatibility names for `fp8eval.engines.vllm` (the pieces the two vLLM engines share, split by concern).

New code imports the modules of `fp8eval.engines.vllm` directly; this module keeps `vllm_common.X` working.
"""

from __future__ import annotations

from fp8eval.engines.vllm.args import (  # noqa: F401
    VLLM_PYTHON_ENV,
    engine_args_to_flags,
    log_dir,
    merged_engine_args,
    plain,
    vllm_python,
)
from fp8eval.engines.vllm.child import (  # noqa: F401
    ChildProcess,
    _install_handlers,
    child_env,
    cpu_threads,
    wait_until,
)
from fp8eval.engines.vllm.kvcheck import (  # noqa: F401
    canonical_cache_dtype,
    canonical_skip_layers,
    cpu_lacks_fp8_kv,
    fp8_on_cpu_message,
    kv_mismatches,
    precheck_fp8_on_cpu,
    requested_kv,
    runs_on_cpu,
    uses_fp8_cache,
    vllm_distribution,
)
from fp8eval.engines.vllm.logscan import (  # noqa: F401
    INFO_PATTERNS,
    WARNING_PATTERNS,
    RootCause,
    add_per_head_backend_warning,
    arm_warnings,
    attention_backend_from_log,
    known_failure_hint,
    last_error_line,
    root_cause,
    root_cause_line,
    scan_log_lines,
)
from fp8eval.engines.vllm.stats import metric_totals, prefill_stats  # noqa: F401
