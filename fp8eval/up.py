"""`python -m fp8eval.up`: start a run's vLLM servers and keep them running, so that runs attach instead of
starting vLLM (the warm path of issue 34).

    python -m fp8eval.up                         # the default job's arms (bf16, fp8): managed servers, kept alive
    python -m fp8eval engine=server engine.keep_alive=true   # attaches to them: no vLLM start-up
    python -m fp8eval.up model=gemma3-270m kv=fp8_skip_sw     # any run's overrides: its arms' servers
    python -m fp8eval.up status                  # the kept-alive servers, one line each
    python -m fp8eval.up down                    # stop them all

The servers are `engine=server`'s managed servers (fp8eval.engines.server.managed) started with
`engine.keep_alive=true`: detached from this process, registered under the cache's `servers/` by what they compute
(fp8eval.engines.server.kept), sized to share the GPU when there are several. A run with the same overrides plus
`engine=server engine.keep_alive=true` attaches to each arm's server after its /health answers; records and
fingerprints are those of a managed server started by the run itself.
"""

from __future__ import annotations

import dataclasses
import sys

from fp8eval.core.errors import Fp8evalError
from fp8eval.core.paths import CONF_DIR
from fp8eval.engines.server import kept

USAGE = __doc__.split("\n\n")[1]


def down() -> int:
    entries = kept.entries()
    for entry in entries:
        kept.stop(entry)
        print(f"stopped {entry['arm']} at {entry['url']} (pid {entry['pid']})")
    if not entries:
        print("no kept-alive server is running")
    return 0


def status() -> int:
    entries = kept.entries()
    for e in entries:
        print(f"{e['arm']}: {e['url']} pid {e['pid']} since {e['started']} ({e['args'].get('kv_cache_dtype', 'auto')} "
              f"cache, {e['args'].get('model')}) log {e['log']}")
    if not entries:
        print("no kept-alive server is running")
    return 0


def up(overrides: list[str]) -> int:
    """Compose the run's config as `python -m fp8eval` would, and start (or find) its arms' kept-alive servers."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from fp8eval.arms import open_engines, resolve_arms
    from fp8eval.registry import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=[*overrides, "engine=server"]))
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, keep_alive=True))
    arms = resolve_arms(cfg, control=True)  # a control arm too, checked at the door
    with open_engines(cfg, kind="server") as door:
        info = door.prestart(arms)
        for arm in arms:
            engine = door.open(arm)  # waits for /health and checks the server (preflight, knob audit)
            how = "attached" if info and arm.name in info.get("attached", []) else "started"
            print(f"{arm.name}: {engine.root} ({how}; log {engine.log_path})")
    extra = " ".join(o for o in overrides if not o.startswith(("engine=", "engine.keep_alive")))
    print(f"kept alive. Run against them: python -m fp8eval engine=server engine.keep_alive=true {extra}".rstrip())
    print("stop them: python -m fp8eval.up down")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if argv[:1] in (["down"], ["--down"]):
        return down()
    if argv[:1] in (["status"], ["--status"]):
        return status()
    try:
        return up([a for a in argv if a != "--"])
    except Fp8evalError as e:
        print(f"fp8eval.up: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from fp8eval.core.secrets import guard_std_streams

    guard_std_streams()  # the servers' URLs it prints are redacted (fp8eval.core.secrets)
    sys.exit(main())
