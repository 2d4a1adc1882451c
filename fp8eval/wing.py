"""One shell for every Hydra wing (`python -m fp8eval`, `.divergence`, `.sensitivity`, `.pareto`, `.power`,
`.calibrate`, `.perf`): the same redaction, signals and exit codes for all of them.

    main = hydra_wing("fp8eval.divergence", "divergence", body, errors=(Fp8evalError, ValueError))
    if __name__ == "__main__":
        main()

`main()` (also what a console script calls):
- routes stdout, stderr and logging through `fp8eval.core.secrets.redact` first (`guard_std_streams`), so
  every line printed, Hydra's own errors included, is redacted; Hydra's files are redacted by the
  `RedactHydraFiles` callback every wing's YAML registers (tests/test_wing_shell.py checks both);
- makes SIGTERM behave like Ctrl-C (`fp8eval.core.signals`): one line, exit 130 (SIGINT) or 143 (SIGTERM),
  `finally` blocks run (records committed, engines closed);
- runs `argv(sys.argv[1:])` first where given (checks and rewrites of the command line before Hydra sees it);
- composes the wing's config (`conf/<config_name>.yaml`), turns it into its typed dataclass, checks it with the
  one validation pass (`fp8eval.validate.validate_config`: ranges, types, NaN, lengths against max_model_len) and
  calls `body(cfg, run_dir)`; an exception of `errors` (also one raised by a resolver while the config is made, such
  as `${calibrated:...}` with nothing calibrated) is printed as one line `\\n<prog>: <message>` and exits 2; a
  non-zero int returned by `body` is the exit status.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from fp8eval.core.errors import Fp8evalError, InputError
from fp8eval.core.paths import CONF_DIR
from fp8eval.core.secrets import guard_std_streams
from fp8eval.core.signals import exit_on_sigterm, interrupt_exit_code
from fp8eval.validate import validate_config

ERROR_EXIT = 2
INTERRUPTED = "interrupted; what was finished is kept, rerun the same command to resume"


def _cause(exc: BaseException, errors: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of `errors` in the chain of causes of `exc` (exc included), else None."""
    seen = exc
    while seen is not None:
        if isinstance(seen, errors):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def hydra_wing(prog: str, config_name: str, body: Callable[[Any, Path], int | None], *,
               errors: tuple[type[BaseException], ...] = (Fp8evalError,),
               argv: Callable[[list[str]], list[str] | None] | None = None,
               interrupted: str = INTERRUPTED) -> Callable[[], None]:
    """The wing's `main()`: see the module docstring. `prog` names the wing in its one-line errors
    (`fp8eval.divergence`); `config_name` is its YAML in conf/."""

    def app(cfg: DictConfig) -> None:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        try:
            typed = OmegaConf.to_object(cfg)
            validate_config(typed)  # the one validation pass over the whole config, before any engine starts
            code = body(typed, run_dir)
        except InterpolationResolutionError as e:
            cause = _cause(e, errors)
            if cause is None:
                raise
            _fail(prog, cause)
        except (InputError, *errors) as e:
            _fail(prog, e)
        if code:
            sys.exit(int(code))

    # Hydra names the job after the task function's module: the wing's own `__main__`, as before this shell.
    app.__module__ = f"{prog}.__main__"
    app.__qualname__ = app.__name__ = "main"
    hydra_app = hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")(app)

    def main() -> None:
        guard_std_streams()  # every line printed, Hydra's errors included, is redacted (fp8eval.core.secrets)
        exit_on_sigterm()  # SIGTERM behaves like Ctrl-C: one line, work kept (exit 143)
        if prog != "fp8eval" and any(a in ("--help", "-h") for a in sys.argv[1:]):
            # the keys explained from the sources (`fp8eval <wing> --help`), not Hydra's generic help (--hydra-help)
            sys.stdout.flush()
            os.execv(sys.executable, [sys.executable, "-m", "fp8eval", prog.removeprefix("fp8eval."),
                                      *sys.argv[1:]])
        try:
            if argv is not None:
                new = argv(sys.argv[1:])
                if new is not None:
                    sys.argv[1:] = new
            hydra_app()
        except KeyboardInterrupt as exc:
            print(f"\n{prog}: {interrupted}", file=sys.stderr)
            sys.exit(interrupt_exit_code(exc))
        except errors as e:  # from the command line's own checks
            _fail(prog, e)

    main.__doc__ = f"`python -m {prog}` (fp8eval.wing.hydra_wing over conf/{config_name}.yaml)."
    return main


def _fail(prog: str, e: BaseException) -> None:
    print(f"\n{prog}: {e}", file=sys.stderr)
    sys.exit(ERROR_EXIT)
