"""The reference engine gives the same records whatever the CPU does: 1, 2 or 4 threads, ATen's AVX2 kernels
or the machine's default (AVX-512 here), and a machine made busy by other CPU-bound runs (issue 26). Each
run is a fresh process with fresh records, the real embedded model, both arms (FP8 with the default fa3_fp8
emulation, and the BF16 baseline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytest.importorskip("torch")
pytest.importorskip("transformers")

# The attention alone, bit for bit: every mode at decode, prefill and chunked-prefill shapes (GQA 9 -> 3 heads).
_BITS = """
import hashlib, sys, torch
from fp8eval.engines import cpu_numerics
from fp8eval.engines.attention_emulation import emulated_attention
cpu_numerics.pin()
torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(0)
h = hashlib.sha256()
for lq, lk in ((1, 1777), (700, 700), (300, 2000)):
    q, k = torch.randn(1, 9, lq, 64, generator=g) * 3, torch.randn(1, 3, lk, 64, generator=g) * 3
    v = torch.randn(1, 3, lk, 64, generator=g)
    for mode in ("kv_only", "fa3_fp8", "qp_unit_scale"):
        h.update(emulated_attention(q, k, v, None, 0.125, mode=mode, accumulation="exact", fmt="e4m3").numpy().tobytes())
    h.update((torch.randn(700, 576, generator=g) @ torch.randn(576, 1536, generator=g)).numpy().tobytes())
print(h.hexdigest())
"""


def _bits(threads: int, env_extra: dict) -> str:
    proc = subprocess.run([sys.executable, "-c", _BITS, str(threads)], env=_env(env_extra), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_attention_and_matmul_bits_do_not_depend_on_threads_or_vector_width():
    base = _bits(2, {})
    for threads, env in ((1, {}), (4, {}), (1, {"ATEN_CPU_CAPABILITY": "avx2"}), (4, {"ATEN_CPU_CAPABILITY": "avx2"})):
        assert _bits(threads, env) == base, (threads, env)


JOB = ["engine=reference", "model=smollm2-135m", "kv=fp8", "task=niah", "task.lengths=[384]",
       "task.depths=[0,100]", "sampling.max_tokens=16", "report=false", "progress=false"]


def _env(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS",
                                                            "MKL_NUM_THREADS")}
    return {**env, "PYTHONPATH": str(REPO), **env_extra}


def _start(tmp: Path, threads: int, env_extra: dict) -> tuple[Path, subprocess.Popen]:
    tmp.mkdir(parents=True)
    with open(tmp / "stderr.txt", "w") as err:  # a file, not a pipe: runs side by side never block on output
        proc = subprocess.Popen([sys.executable, "-m", "fp8eval", *JOB, f"engine.threads={threads}",
                                 f"records_dir={tmp / 'records'}", f"hydra.run.dir={tmp / 'run'}"],
                                cwd=tmp, env=_env(env_extra), stdout=subprocess.DEVNULL, stderr=err)
    return tmp, proc


def _records(started: tuple[Path, subprocess.Popen]) -> dict:
    tmp, proc = started
    proc.wait(timeout=1800)
    assert proc.returncode == 0, (tmp / "stderr.txt").read_text()[-3000:]
    summary = json.loads((tmp / "run" / "summary.json").read_text())
    out = {}
    for name, arm in summary["arms"].items():
        recs = [json.loads(line) for line in Path(arm["records"]).read_text().splitlines() if line.strip()]
        out[name] = sorted((r["sample_id"], r["completion"], r["output_tokens"], r["finish_reason"]) for r in recs)
        out[name + "_fingerprint"] = arm["fingerprint"]
    return out


@pytest.mark.slow
def test_same_records_across_threads_cpu_capability_and_load(tmp_path):
    """The base run (2 threads, AVX-512) runs alone; then 1 thread, 4 threads, AVX2 and a second 2-thread run
    all run at once, 9 threads on this 2-core machine: each is the others' CPU-burning load (the machine is busy
    for every one of them, as 3 `while True` burners made it before, without burning time on nothing)."""
    base = _records(_start(tmp_path / "t2", 2, {}))
    assert len(base["fp8"]) == len(base["bf16"]) == 2
    started = {"1 thread on a busy machine": _start(tmp_path / "t1", 1, {}),
               "4 threads on a busy machine": _start(tmp_path / "t4", 4, {}),
               "ATEN_CPU_CAPABILITY=avx2 on a busy machine": _start(tmp_path / "avx2", 2,
                                                                     {"ATEN_CPU_CAPABILITY": "avx2"}),
               "2 threads on a busy machine": _start(tmp_path / "busy", 2, {})}
    try:
        runs = {label: _records(s) for label, s in started.items()}
    finally:
        for _, proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for label, got in runs.items():
        assert got == base, f"{label}: records differ from 2 threads on an idle machine"
