"""The noise-floor control arm: the baseline's kv option run again with something that should not change
accuracy, so a flip count of the FP8 arm can be set against the flips that arise without FP8 at all.

`control=<name>` (conf/control/) names what differs: vLLM engine args over the baseline's
(`max_num_seqs`, `enforce_eager`, `tensor_parallel_size`, ...), engine-group fields for this arm
(`prefill_chunk`, `concurrency`), environment variables of its vLLM process (`VLLM_BATCH_INVARIANT`) and a
seed offset. Which of those take effect depends on the engine; `knob_effects` says so knob by knob, and an
arm none of whose knobs takes effect is refused (it would reproduce the baseline and read as a noise floor
of zero) unless `control.allow_inert=true`, in which case the summary and the report say it is inert.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from omegaconf import OmegaConf

from fp8eval.config import ControlConfig, RunConfig, plain
from fp8eval.core.errors import Fp8evalError
from fp8eval.engines import engine_class, resolve_kind
from fp8eval.engines.spec import ArmSpec

ROLE = "control"
# EngineConfig fields a control may set for its arm (which engine reads each: its `capabilities.engine_fields`).
ENGINE_FIELDS = ("prefill_chunk", "concurrency")


class ControlError(Fp8evalError):
    """A control arm cannot run as asked (unknown setting, or nothing it sets takes effect here)."""


def control_of(cfg) -> ControlConfig | None:
    """The run's control config, None for `control=none` (or a config without the field)."""
    c = getattr(cfg, "control", None)
    if c is None:
        return None
    if OmegaConf.is_config(c):
        c = OmegaConf.to_object(c)
    return None if c.name in ("none", "", None) else c


def arm_name(baseline: str, control: ControlConfig) -> str:
    """The control arm's name (summary.json key, `engine.base_urls` key): `<baseline>-<control>`."""
    return f"{baseline}-{control.name}"


def with_control_arm(cfg, arms: list[ArmSpec]) -> list[ArmSpec]:
    """The run's arms with its control arm last, when `control` is set ([baseline, variant, control])."""
    control = control_of(cfg)
    if control is None:
        return arms
    if arms[0].role != "baseline" or len(arms) < 2:
        raise ControlError(f"control={control.name} needs a variant and its baseline to stand beside; this run has "
                           f"{'no baseline (baseline=none)' if arms[0].role != 'baseline' else 'the baseline alone'}")
    return arms + [control_arm(cfg, arms[0], control)]


def preflight(cfg, arms: list[ArmSpec], sampling: dict, repeats: int | None = None,
              rules: Callable[[list[dict]], None] | None = None, out=print) -> dict | None:
    """The one preflight of a control arm, before any engine starts: which of the control's settings take effect on
    this engine (ControlError when none does, unless control.allow_inert); the summary's `control` block, None
    without a control. `rules` is a wing's own knob rules: it may amend the rows (a prefill-only wing marks the
    seed inert) before they are judged. The arms' cache formats were checked when the control arm was made."""
    control = control_of(cfg)
    if control is None:
        return None
    kind = resolve_kind(cfg)
    repeats = int(cfg.task.repeats) if repeats is None else int(repeats)
    effects = knob_effects(cfg, kind, arms[0], control, sampling, repeats)
    if rules is not None:
        rules(effects)
    effective = check_effective(control, kind, effects)
    if not effective:
        out(f"note: control={control.name} changes nothing on the {kind} engine (control.allow_inert=true): "
            "its flips measure only the engine's own run-to-run nondeterminism")
    return {"arm": arms[-1].name, **describe(control, kind, effects, effective)}


def control_arm(cfg, base: ArmSpec, control: ControlConfig) -> ArmSpec:
    """The control arm: the baseline's kv and engine args with the control's engine args over them."""
    bad = sorted(set(plain(control.engine)) - set(ENGINE_FIELDS))
    if bad:
        raise ControlError(f"control={control.name}: control.engine sets {', '.join(bad)}; valid: "
                           f"{', '.join(ENGINE_FIELDS)}")
    args = {**base.engine_args, **plain(control.engine_args)}
    for key in ("kv_cache_dtype", "kv_cache_dtype_skip_layers"):  # the noise floor of the baseline's own cache
        mine, theirs = args.get(key, _CACHE_DEFAULTS[key]), base.engine_args.get(key, _CACHE_DEFAULTS[key])
        if mine != theirs:
            raise ControlError(f"control={control.name} sets {key}={mine} but its baseline {base.name} runs {key}="
                               f"{theirs}: a control arm keeps the baseline's cache format (it measures noise, not a "
                               f"format); drop control.engine_args.{key}")
    return dataclasses.replace(base, role=ROLE, engine_args=args, label=arm_name(base.name, control),
                               env={str(k): str(v) for k, v in plain(control.env).items()},
                               engine_overrides=plain(control.engine), seed_offset=int(control.seed_offset))


_CACHE_DEFAULTS = {"kv_cache_dtype": "auto", "kv_cache_dtype_skip_layers": None}


def material(control: ControlConfig) -> dict:
    """What the control adds to its arm's fingerprint: every setting it changes (never empty, so a control
    arm's records never collapse into the baseline's even when the engine ignores its settings)."""
    return {"name": control.name, "engine_args": plain(control.engine_args), "engine": plain(control.engine),
            "env": {k: str(v) for k, v in plain(control.env).items()}, "seed_offset": int(control.seed_offset)}


def knob_effects(cfg: RunConfig, kind: str, base: ArmSpec, control: ControlConfig, sampling: dict,
                 repeats: int = 1) -> list[dict]:
    """One row per setting the control changes: {knob, value, effective, why}. `kind` is the resolved engine
    kind, whose `capabilities` say which knobs it honours; `base` the baseline arm it is compared with."""
    caps = engine_class(kind).capabilities
    rows: list[dict[str, Any]] = []
    e = cfg.engine
    name = arm_name(base.name, control)
    base_url = getattr(e, "base_url", None)
    external = caps.attaches and bool(base_url or _arm_url(cfg, name) or _arm_url(cfg, base.name))
    own_url = external and (_arm_url(cfg, name) or base_url) != (_arm_url(cfg, base.name) or base_url)
    honoured = {arg: (rule, why) for arg, rule, why in caps.honoured_args}

    def row(knob: str, value, effective: bool, why: str) -> None:
        rows.append({"knob": knob, "value": value, "effective": bool(effective), "why": why})

    base_args = engine_class(kind).effective_engine_args(cfg, base)  # with the defaults the engine adds
    for k, v in plain(control.engine_args).items():
        knob = f"engine_args.{k}"
        if base_args.get(k) == v:
            row(knob, v, False, f"the baseline already runs with {k}={v}")
        elif caps.all_engine_args and not external:
            row(knob, v, True, caps.engine_args_why)
        elif caps.all_engine_args:
            row(knob, v, own_url, "declared: this arm's own server (engine.base_urls) must have been started with it"
                if own_url else "an external server's flags are its own: give this arm its own server in "
                f"engine.base_urls.{arm_name(base.name, control)}")
        elif k in honoured:
            rule, why = honoured[k]
            eff = repeats > 1 and int(v) < repeats if rule == "batch_cap" else float(v) > 0
            row(knob, v, eff, why if eff or rule != "batch_cap" else
                f"the {kind} engine decodes one sequence at a time unless a request has several repeats")
        else:
            row(knob, v, False, f"not a setting of the {kind} engine")
    for k, v in plain(control.engine).items():
        knob = f"engine.{k}"
        if getattr(e, k, None) == v:
            row(knob, v, False, f"the engine group already has {k}={v}")
        elif k in caps.engine_fields:
            row(knob, v, True, f"the {kind} engine's {k} for this arm only")
        else:
            row(knob, v, False, f"the {kind} engine does not read {k} per arm")
    for k, v in plain(control.env).items():
        knob = f"env.{k}"
        if caps.process_env and not external:
            row(knob, str(v), True, "set in this arm's vLLM process only")
        else:
            row(knob, str(v), False, f"the {kind} engine starts no vLLM process of its own")
    if control.seed_offset:
        temp = sampling.get("temperature")
        sampled = temp is None or float(temp) > 0
        if not caps.follows_sampling:  # scripted answers: seeds matter only under the args that draw with them
            sampled = any(plain(base.engine_args).get(a) or plain(control.engine_args).get(a) for a in caps.seed_args)
        row("seed_offset", int(control.seed_offset), sampled,
            "other per-(sample, repeat) sampling seeds" if sampled else "greedy decoding ignores the seed")
    return rows


def _arm_url(cfg, name: str):
    urls = getattr(cfg.engine, "base_urls", None) or {}
    value = urls.get(name)
    return tuple(value) if isinstance(value, (list, tuple)) else value


def check_effective(control: ControlConfig, kind: str, effects: list[dict]) -> bool:
    """True when at least one knob takes effect; raises ControlError when none does and the control does not
    allow it (the message names every knob and why); False (inert, allowed) otherwise."""
    if any(r["effective"] for r in effects):
        return True
    if control.allow_inert:
        return False
    why = "; ".join(f"{r['knob']}={r['value']}: {r['why']}" for r in effects) or "it changes nothing"
    hint = engine_class(kind).capabilities.control_hint or "none of the shipped controls"
    raise ControlError(
        f"control={control.name} changes nothing on the {kind} engine ({why}), so its arm would reproduce the "
        f"baseline and read as a noise floor of zero. Choose a control that takes effect here ({kind}: {hint}), or "
        f"set control.allow_inert=true to measure only the engine's own run-to-run nondeterminism.")


def describe(control: ControlConfig, kind: str, effects: list[dict], effective: bool) -> dict:
    """The summary's `control` block (without the flip counts, which metrics add)."""
    return {"name": control.name, "description": control.description, "engine": kind,
            "inert": not effective, "knobs": effects}


def format_lines(summary: dict) -> list[str]:
    """The terminal's lines on the control arm: both arms' flips against the baseline and the excess."""
    c = summary.get("control")
    if not c:
        return []
    names = list(summary.get("arms") or {})
    variant = names[1] if len(names) > 1 else "variant"
    v, k = c.get("variant") or {}, c.get("control") or {}
    n = c.get("n_pairs", 0)
    out = [f"control {c['arm']} ({c.get('description') or c['name']}, {c['engine']} engine"
           + (", INERT: none of its settings takes effect here" if c.get("inert") else "") + ")"]
    out.append(f"  flips vs {names[0] if names else 'baseline'} on {n} pairs: {variant} {v.get('flips', 0)} "
               f"(lost {v.get('lost', 0)}, gained {v.get('gained', 0)}), {c['arm']} {k.get('flips', 0)} "
               f"(lost {k.get('lost', 0)}, gained {k.get('gained', 0)})")
    if c.get("excess_flip_rate") is not None:
        lo, hi = c["ci"]
        out.append(f"  excess flip rate of {variant} over the control: {100 * c['excess_flip_rate']:+.1f} points, "
                   f"{100 * c['level']:.0f}% CI [{100 * lo:+.1f}, {100 * hi:+.1f}] (paired, by sample)")
    inert = [r for r in c.get("knobs") or [] if not r["effective"]]
    for r in inert:
        out.append(f"  {r['knob']}={r['value']}: no effect here ({r['why']})")
    return out
