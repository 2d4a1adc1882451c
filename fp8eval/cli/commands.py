"""The subcommands of `fp8eval`: each is an existing tool, run as `python -m <module>` runs it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    module: str  # run as `python -m <module>` (its `if __name__ == "__main__"` block)
    summary: str
    config: str | None = None  # a Hydra app's primary config (conf/<config>.yaml); None: an argparse tool
    schema: tuple[str, str] | None = None  # (module, dataclass) of its config
    prefixes: tuple[str, ...] = ()  # an argparse tool: key=value prefixes it takes (report.gate=95)


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("run", "fp8eval", "evaluate a kv arm against its baseline and print the recovery table (the default)",
            "config", ("fp8eval.config", "RunConfig")),
    Command("report", "fp8eval.report", "the recovery report (tables, verdicts, dashboard) of one or more run dirs",
            prefixes=("report", "stats")),
    Command("records", "fp8eval.records", "check or repair an arm's records files", prefixes=("records",)),
    Command("power", "fp8eval.power", "samples x repeats a comparison needs, the planned run's MDE and cost",
            "power", ("fp8eval.power.config", "PowerRunConfig")),
    Command("pareto", "fp8eval.pareto", "KV formats x skip lists x calibration on one frontier, with the pick",
            "pareto", ("fp8eval.pareto.config", "ParetoRunConfig")),
    Command("divergence", "fp8eval.divergence", "divergence (KL) of a kv arm from its baseline per position, on the decode and/or prefill path",
            "divergence", ("fp8eval.divergence.config", "DivergenceRunConfig")),
    Command("sensitivity", "fp8eval.sensitivity", "which layers should stay in BF16 (per-layer ranking)",
            "sensitivity", ("fp8eval.sensitivity.config", "SensitivityRunConfig")),
    Command("calibrate", "fp8eval.calibrate", "calibrated FP8 KV-cache scales with llm-compressor, cached",
            "calibrate", ("fp8eval.calibrate.config", "CalibrateConfig")),
    Command("perf", "fp8eval.perf", "latency sweep, throughput and KV capacity per arm",
            "perf", ("fp8eval.perf.config", "PerfRunConfig")),
    Command("probe", "fp8eval.probe", "how accurately this GPU's FP8 tensor cores sum a long P.V",
            prefixes=("probe",)),
    Command("knobaudit", "fp8eval.knobaudit", "start one arm and audit what vLLM really ran (outside a scored run)",
            prefixes=("knobaudit",)),
    Command("up", "fp8eval.up", "start a run's vLLM servers and keep them alive so runs attach (up status, up down)"),
    Command("replay", "fp8eval.cli.replay", "rerun a saved run exactly from RUN_DIR/.hydra, or refuse in one line"),
)}
