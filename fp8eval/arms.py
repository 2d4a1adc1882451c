"""The one door to arms and their engines: which arms a run has, and an engine for each.

Every wing (the runner, divergence, sensitivity, perf, and any new one) asks here and nowhere else:

    from fp8eval.arms import open_engines, resolve_arms

    arms = resolve_arms(cfg)                 # [baseline, variant], or one arm (ArmSpec each)
    with open_engines(cfg) as door:          # one shared dict: the reference engine's model loads once
        for arm in arms:
            with door.engine(arm) as engine: # closed when the block ends (vLLM frees the GPU)
                ...
            # or door.open(arm): stays open until door.close(engine) or the end of the `with`

- `resolve_arms(cfg)`: the variant's kv comes from the run's own composition; the baseline's (`baseline:
  bf16`) is composed by Hydra from `conf/kv/<baseline>.yaml` exactly like a variant would be (defaults list,
  schema, resolvers such as `${calibrated:tensor}`), so the two arms of a pair can never follow different
  rules. A variant that is the baseline (same kv setting, same engine args) is one arm, role "baseline";
  a variant named like the baseline whose setting differs (a BF16 *control* arm, e.g. `kv=bf16
  kv.engine_args.attention_backend=...`) stays a second arm, named `<kv>-variant`.
- `resolve_arms(cfg, control=True)`: with the run's `control=<name>` arm last (fp8eval.control), refused at once
  when it cannot be a noise floor; `fp8eval.control.preflight` then says which of its knobs take effect.
- `resolve_arms(cfg, names=[...])`: any list of kv options (perf's `perf.arms`), the first the baseline.
- `arm_material(...)`: what an arm's fingerprint covers, assembled one way for every wing.
- `arm_spec(cfg, kv, role, name)`: one arm from a KVConfig a wing made itself (a sweep point).
- `open_engines(cfg, kind=None)`: an `ArmEngines` context manager; `kind` forces an engine kind (perf
  starts `server` engines whatever `engine.kind` says). Every engine still open is closed on exit.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

import fp8eval.control as controls
from fp8eval.config import KVConfig, RunConfig, bf16_cache_spelling, kv_fingerprint_view, plain
from fp8eval.core.errors import Fp8evalError
from fp8eval.core.paths import CONF_DIR
from fp8eval.engines import build_engine
from fp8eval.engines.base import Engine
from fp8eval.engines.spec import ArmSpec, merged_engine_args

__all__ = ["ArmEngines", "ArmError", "ArmSpec", "arm_material", "arm_spec", "compose_kv", "open_engines",
           "resolve_arms", "same_setting"]

CONTROL_SUFFIX = "-variant"


class ArmError(Fp8evalError):
    """An arm cannot be resolved (an unknown baseline option, ...); the message lists the valid ones."""


def compose_kv(name: str, model_name: str) -> KVConfig:
    """`conf/kv/<name>.yaml` composed by Hydra for `model_name` (its resolvers need the model)."""
    overrides = [f"kv={name}", f"model.name={model_name}"]
    try:
        if GlobalHydra.instance().is_initialized():
            cfg = compose(config_name="config", overrides=overrides)
        else:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose(config_name="config", overrides=overrides)
    except MissingConfigException:
        valid = sorted(p.stem for p in (CONF_DIR / "kv").glob("*.yaml"))
        raise ArmError(f"baseline={name!r} is not a kv option; valid: {', '.join(valid)}, none") from None
    kv = OmegaConf.to_object(cfg.kv)
    assert isinstance(kv, KVConfig)
    return kv


def arm_spec(cfg: RunConfig, kv: KVConfig, role: str = "single", name: str | None = None) -> ArmSpec:
    """One arm from a kv option: its engine args merged (model < kv < engine). `name` defaults to the kv's."""
    kv = _kv_object(kv)
    return ArmSpec(kv, role, merged_engine_args(cfg, kv), name or "")


def same_setting(a: ArmSpec, b: ArmSpec) -> bool:
    """True when two arms run the same thing: the same kv setting as fingerprints see it (name and
    description aside) and the same engine args."""
    return kv_view(a.kv) == kv_view(b.kv) and a.engine_args == b.engine_args


def resolve_arms(cfg: RunConfig, names: list[str] | None = None, control: bool = False) -> list[ArmSpec]:
    """The arms of a run, the baseline first (pairing reads its records first).

    names=None: [baseline, variant] from `cfg.baseline` and `cfg.kv`; one arm when `baseline` is none
    (role "single") or when the variant is the baseline (role "baseline"). names=[...]: those kv options
    (duplicates dropped; `cfg.kv` itself where a name is the run's kv), roles baseline, then variant for
    `cfg.kv` and "arm" for the others. control=True: the run's control arm last, role "control", when
    `control=<name>` is set (ControlError when it has no variant and baseline to stand beside, or would not run
    the baseline's cache format); `fp8eval.control.preflight` judges its knobs before any engine starts."""
    arms = _resolve(cfg, names)
    return controls.with_control_arm(cfg, arms) if control and names is None else arms


def baseline_arm(cfg: RunConfig) -> ArmSpec:
    """The run's baseline arm alone (`cfg.baseline`, composed like every arm), for a wing that measures many
    variants of its own against it (pareto's sweep points)."""
    return arm_spec(cfg, compose_kv(cfg.baseline, cfg.model.name), "baseline")


def _resolve(cfg: RunConfig, names: list[str] | None) -> list[ArmSpec]:
    variant = _kv_object(cfg.kv)
    if names is not None:
        out: list[ArmSpec] = []
        for i, n in enumerate(dict.fromkeys(names)):
            kv = variant if n == variant.name else compose_kv(n, cfg.model.name)
            out.append(arm_spec(cfg, kv, "baseline" if i == 0 else "variant" if n == variant.name else "arm"))
        return out
    baseline = cfg.baseline
    if baseline in (None, "none", ""):
        return [arm_spec(cfg, variant, "single")]
    var = arm_spec(cfg, variant, "variant")
    base = arm_spec(cfg, compose_kv(baseline, cfg.model.name), "baseline")
    if baseline == variant.name:
        if same_setting(base, var):
            return [arm_spec(cfg, variant, "baseline")]
        # A control arm: the baseline's kv option with other engine args. Two arms, two names.
        var = arm_spec(cfg, variant, "variant", variant.name + CONTROL_SUFFIX)
    return [base, var]


class ArmEngines:
    """Opens the engines of arms with one `shared` dict (the reference engine keeps its loaded model there,
    so every arm of one model loads it once) and closes every engine it opened that is still open."""

    def __init__(self, cfg: RunConfig, kind: str | None = None):
        self.cfg = cfg
        self.kind = kind
        self.shared: dict = {}
        self._open: list[Engine] = []
        self._lock = threading.Lock()  # perf opens arms from several threads
        # After prestart: the arms' engines run side by side and stay open until close_all; open() of an arm
        # already open returns its engine (the anatomy after the arms), close() of one waits for close_all.
        self.keep_open = False
        self.prestarted: dict | None = None
        self._by_arm: dict[str, Engine] = {}

    def prestart(self, arms: list[ArmSpec]) -> dict | None:
        """Start every arm's engine at once where the engine kind can and they all fit (vLLM on one GPU:
        fp8eval.engines.vllm.startup); then keep them open until the door closes. What was started, or None."""
        from fp8eval.engines import prestart

        self.prestarted = prestart(self.cfg, arms, self.shared, kind=self.kind)
        self.keep_open = self.prestarted is not None
        return self.prestarted

    def open(self, arm: ArmSpec) -> Engine:
        """Build and start the arm's engine; it stays open until `close(engine)` or the end of the door."""
        if self.keep_open and arm.name in self._by_arm:
            return self._by_arm[arm.name]
        engine = build_engine(self.cfg, arm, self.shared, kind=self.kind)
        with self._lock:
            self._open.append(engine)
            self._by_arm[arm.name] = engine
        return engine

    def close(self, engine: Engine) -> None:
        """Close one engine (safe twice); after prestart, only at close_all."""
        if self.keep_open:
            return
        self._close(engine)

    def _close(self, engine: Engine) -> None:
        with self._lock:
            if engine in self._open:
                self._open.remove(engine)
            self._by_arm = {k: e for k, e in self._by_arm.items() if e is not engine}
        engine.close()

    @contextmanager
    def engine(self, arm: ArmSpec) -> Iterator[Engine]:
        """The arm's engine for the `with` block, closed when it ends (even on an error)."""
        engine = self.open(arm)
        try:
            yield engine
        finally:
            self.close(engine)

    def close_all(self) -> None:
        """Close every engine still open, the last opened first; the first error is raised after all."""
        from fp8eval.engines import discard_prestarted

        discard_prestarted(self.shared)  # engines started for arms the run never reached
        errors: list[BaseException] = []

        def close_one(engine: Engine) -> None:
            try:
                self._close(engine)
            except BaseException as exc:  # noqa: BLE001 - close the others, then report
                errors.append(exc)

        # Side by side (after prestart) they close at once: a vLLM shutdown is seconds each.
        closers = [threading.Thread(target=close_one, args=(e,)) for e in self._open[::-1]] if self.keep_open else []
        for t in closers:
            t.start()
        for t in closers:
            t.join()
        while self._open:  # one after the other, the last opened first
            close_one(self._open[-1])
        if errors:
            raise errors[0]

    def __enter__(self) -> "ArmEngines":
        return self

    def __exit__(self, *exc) -> None:
        self.close_all()


def open_engines(cfg: RunConfig, kind: str | None = None) -> ArmEngines:
    """The door's engine half as a context manager: `with open_engines(cfg) as door: door.engine(arm)`."""
    return ArmEngines(cfg, kind)


def _kv_object(kv) -> KVConfig:
    return kv if isinstance(kv, KVConfig) else OmegaConf.to_object(kv)


# Model fields that never change a number (left out of every fingerprint).
MODEL_LEFT_OUT = ("name", "notes", "sampling", "env")
SKIP_KEY = "kv_cache_dtype_skip_layers"


def model_view(model, left_out: tuple[str, ...] = MODEL_LEFT_OUT, keep_dummy: bool = False) -> dict:
    """The model config as fingerprints see it: without `left_out`, and `dummy` only where true (only dummy-weight
    runs carry it, so every other fingerprint is unchanged) unless `keep_dummy`."""
    d = plain(model)
    for k in left_out:
        d.pop(k, None)
    if not keep_dummy and not d.get("dummy"):
        d.pop("dummy", None)
    return d


def kv_view(kv, skip_rule: Callable[[object], list] | None = None) -> dict:
    """A kv option (a KVConfig, or an ArmSpec's) as fingerprints see it: name and description aside, emulation
    knobs only where they change a number; `skip_rule` rewrites the skip list first (sensitivity normalises it)."""
    d = plain(getattr(kv, "kv", kv))
    for k in ("name", "description"):
        d.pop(k, None)
    if skip_rule is not None:
        args = dict(d.get("engine_args") or {})
        if SKIP_KEY in args:
            args[SKIP_KEY] = skip_rule(args[SKIP_KEY])
        d["engine_args"] = args
    return kv_fingerprint_view(d)


_NO_SPELLING = object()


def arm_material(cfg, kv, engine: dict, fields: dict, *, model: dict | None = None, kv_d: dict | None = None,
                 dtype=_NO_SPELLING, control=None) -> dict:
    """What an arm's fingerprint covers, one way for every wing (the runner's records, divergence's and
    sensitivity's caches): the model (`model_view` unless given), the engine's description, the kv option
    (`kv_view` of `kv` unless `kv_d` is given) and the wing's own `fields` (its schema, sampling, task, what it
    keeps, ...). `dtype`: an explicit BF16 cache is spelt as the "auto" it replaced for that model dtype
    (`config.bf16_cache_spelling`; left out: no respelling). `control`: a control arm's config (its settings
    join the material, so its results never collapse into the baseline's)."""
    material = {"model": model_view(cfg.model) if model is None else model, "engine": engine,
                "kv": kv_view(kv) if kv_d is None else kv_d, **fields}
    if dtype is not _NO_SPELLING:
        material = bf16_cache_spelling(material, dtype)  # type: ignore[assignment]
    if control is not None:
        material["control"] = controls.material(control)
    return material
