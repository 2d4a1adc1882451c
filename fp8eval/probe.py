"""`python -m fp8eval.probe`: how accurately does this GPU's FP8 tensor-core product sum a long P·V?

An attention-like product, out = P·V with P [M, L] softmax-like weights in [0, 256] (FlashAttention-3's FP8
offset, see engines/attention_emulation.py) and V [L, N] ~ N(0, 1), both e4m3, is computed with
`torch._scaled_mm` with fast accumulation on (`use_fast_accum=True`: the FP8 MMA's reduced-precision
accumulator carries the whole sum) and off (partial sums promoted to FP32), at lengths L = 1k .. 1M, and
compared with float64 of the same FP8 values: relative error ||out - ref||_F / ||ref||_F, the median over a
few seeds. The reference engine's emulation (`kv.accumulation=fast_fp8`, and the same model promoted every
128 keys) runs on the same inputs, so one JSON holds the hardware's and the emulation's curves.

Needs a CUDA GPU with FP8 tensor cores (sm_89+: Ada, Hopper, Blackwell); elsewhere it says so and exits 2,
unless `--emulate` (or `probe.emulate=true`): the emulated curves only, on the CPU. Writes probe.json and
probe.png into outputs/probe/<time>/ (or --out) and prints that directory last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from fp8eval.core.kvargs import key_value_flags
from fp8eval.core.secrets import guard_std_streams

# torch and the emulation (which imports it) are imported where they are used: `--help` answers without them.
if TYPE_CHECKING:
    import torch

DEFAULT_LENGTHS = [1 << p for p in range(10, 21)]  # 1k .. 1M
EMULATE_LENGTHS = [1 << p for p in range(10, 18)]  # 1k .. 128k: the CPU emulation walks the sum serially
EMULATE_MAX = 131072  # on a GPU, the emulated curves stop here (None beyond)
HARDWARE = ("hardware_fast_accum", "hardware_promoted")
PROMOTE_EVERY = 128  # keys per FP32 promotion in the emulated two-level curve (DeepSeek-V3's N_C)
M_ROWS, N_COLS = 64, 64  # query rows x head dim of the product


class NoFP8GPU(RuntimeError):
    """This machine cannot run the hardware probe."""


def fp8_gpu_problem() -> str | None:
    """Why the hardware probe cannot run here (None when it can)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return (f"{torch.cuda.get_device_name()} is sm_{major}{minor}; FP8 tensor cores need sm_89 or newer "
                f"(Ada, Hopper, Blackwell)")
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    return None


def inputs(length: int, seed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """P [M, L] in [0, 256] (exp of N(0, 1) scores minus the row max, plus FA3's 2^8 offset) and
    V [L, N] ~ N(0, 1), both rounded to e4m3 and returned in float32."""
    import torch

    from fp8eval.core.quant import fp8_roundtrip

    g = torch.Generator(device="cpu").manual_seed(seed)
    s = torch.randn(M_ROWS, length, generator=g)
    p = torch.exp(s - s.amax(-1, keepdim=True)) * 256.0
    v = torch.randn(length, N_COLS, generator=g)
    return fp8_roundtrip(p).to(device), fp8_roundtrip(v).to(device)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def hardware_errors(p: torch.Tensor, v: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """torch._scaled_mm with fast accumulation on and off (unit scales: the inputs are exact e4m3 values)."""
    import torch

    a = p.to(torch.float8_e4m3fn)
    b = v.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants its second operand
    one = torch.ones((), device=p.device, dtype=torch.float32)
    out = {}
    for name, fast in (("hardware_fast_accum", True), ("hardware_promoted", False)):
        y = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
        out[name] = _rel(y, ref)
    return out


def emulated_errors(p: torch.Tensor, v: torch.Tensor, ref: torch.Tensor, bits: int,
                    align: str | None = None) -> dict[str, float]:
    """The reference engine's accumulation model: without promotion, and promoted to FP32 every 128 keys."""
    import torch

    from fp8eval.engines.attention_emulation import FAST_ACC_ALIGN, FAST_ACC_PROMOTE_EVERY, fast_fp8_matmul

    align = align or FAST_ACC_ALIGN
    fast = fast_fp8_matmul(p, v, bits=bits, align=align)
    # Promoted: each 128-key chunk through the reduced accumulator (all chunks at once, batched), the chunk
    # results then summed in FP32.
    m, length = p.shape
    n_chunks = length // PROMOTE_EVERY
    head = n_chunks * PROMOTE_EVERY
    pc = p[:, :head].reshape(m, n_chunks, PROMOTE_EVERY).transpose(0, 1)
    vc = v[:head].reshape(n_chunks, PROMOTE_EVERY, -1)
    promoted = torch.zeros(m, v.shape[1], dtype=torch.float32, device=p.device)
    for g in range(0, n_chunks, 64):  # 64 chunks at a time bounds the k-step product tensor
        promoted += fast_fp8_matmul(pc[g:g + 64], vc[g:g + 64], bits=bits, align=align).sum(0, dtype=torch.float32)
    if head < length:
        promoted += fast_fp8_matmul(p[:, head:], v[head:], bits=bits, align=align)
    # kv.accumulation=fa3_unfixed: one reduced-precision accumulator over the whole sum, never promoted (the
    # seed's FA3 before its two-level fix), next to fast_fp8's promotion every FAST_ACC_PROMOTE_EVERY keys.
    unfixed = fast if length <= FAST_ACC_PROMOTE_EVERY else fast_fp8_matmul(p, v, bits=bits, align=align,
                                                                             promote_every=None)
    return {"emulated_fast_fp8": _rel(fast, ref), "emulated_promoted": _rel(promoted, ref),
            "emulated_fa3_unfixed": _rel(unfixed, ref)}


def probe(lengths: list[int], emulate_only: bool, seeds: int = 3, bits: int | None = None,
          fit: bool = False, align: str | None = None) -> dict:
    """The error curves (bits and align default to the reference engine's); raises NoFP8GPU when the hardware
    probe is asked for and cannot run."""
    import torch

    from fp8eval.engines.attention_emulation import FAST_ACC_ALIGN, FAST_ACC_BITS, FAST_ACC_K, FAST_ACC_PROMOTE_EVERY

    bits = FAST_ACC_BITS if bits is None else bits
    align = align or FAST_ACC_ALIGN
    problem = fp8_gpu_problem()
    if problem and not emulate_only:
        raise NoFP8GPU(problem)
    device = "cpu" if emulate_only else "cuda"
    if emulate_only:
        # Thousands of tiny sequential products: one thread is several times faster than a contended pool.
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    curves: dict[str, list[float]] = {}
    for length in lengths:
        per_seed: dict[str, list[float]] = {}
        for seed in range(seeds):
            p, v = inputs(length, seed, device)
            ref = p.double() @ v.double()
            # The emulation walks the sum serially (32 keys a step): on a GPU it covers 1k-128k, the range the
            # 2x criterion is about, so the whole probe stays under a minute.
            errs = emulated_errors(p, v, ref, bits, align) if emulate_only or length <= EMULATE_MAX else {}
            if not emulate_only:
                errs.update(hardware_errors(p, v, ref))
            for k, e in errs.items():
                per_seed.setdefault(k, []).append(e)
        for k in ("emulated_fast_fp8", "emulated_promoted", "emulated_fa3_unfixed",
                  *(() if emulate_only else HARDWARE)):
            vals = per_seed.get(k)
            curves.setdefault(k, []).append(sorted(vals)[len(vals) // 2] if vals else None)
    result = {
        "device": "cpu (emulation only)" if emulate_only else torch.cuda.get_device_name(),
        "capability": None if emulate_only else "sm_%d%d" % torch.cuda.get_device_capability(),
        "torch": torch.__version__, "rows": M_ROWS, "cols": N_COLS, "seeds": seeds,
        "emulation": {"k_step": FAST_ACC_K, "fraction_bits": bits, "align": align,
                      "fast_fp8_promote_every": FAST_ACC_PROMOTE_EVERY,
                      "promote_every": PROMOTE_EVERY},
        "lengths": list(lengths), "rel_error": curves,
        "measure": "||out - ref||_F / ||ref||_F vs float64 of the same e4m3 inputs, median over seeds",
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if not emulate_only:
        hw, em = curves["hardware_fast_accum"], curves["emulated_fast_fp8"]
        result["emulated_over_hardware_fast"] = [round(e / h, 3) if h and e is not None else None
                                                 for e, h in zip(em, hw)]
        if fit:
            result["fit"] = fit_bits(lengths, hw, device)
    return result


def fit_bits(lengths: list[int], hardware: list[float], device, candidates=range(11, 18),
             up_to: int = 131072, aligns=("products", "sum")) -> dict:
    """Which accumulator model (what a k-step aligns: "products" or "sum") and width make the emulated
    fast-accumulation curve closest to the hardware's (seed 0, lengths up to 128k): the worst
    |log2(emulated / hardware)| per candidate; the best one names FAST_ACC_ALIGN / FAST_ACC_BITS to set."""
    from fp8eval.engines.attention_emulation import fast_fp8_matmul

    pairs = [(n, h) for n, h in zip(lengths, hardware) if n <= up_to and h]
    data = [(inputs(n, 0, device), h) for n, h in pairs]
    worst = {}
    for align in aligns:
        for bits in candidates:
            ratios = [_rel(fast_fp8_matmul(p, v, bits=bits, align=align), p.double() @ v.double()) / h
                      for (p, v), h in data]
            worst[f"{align}:{bits}"] = {"max_abs_log2_ratio": round(max(abs(math.log2(r)) for r in ratios), 3),
                                        "ratios": [round(r, 3) for r in ratios]}
    best = min(worst, key=lambda b: worst[b]["max_abs_log2_ratio"])
    align, bits = best.split(":")
    return {"lengths": [n for n, _ in pairs], "by_candidate": worst, "best": best, "best_align": align,
            "best_bits": int(bits), "within_2x": worst[best]["max_abs_log2_ratio"] <= 1.0}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, ys in result["rel_error"].items():
        xs = [n for n, y in zip(result["lengths"], ys) if y is not None]
        ys = [y for y in ys if y is not None]
        ax.plot(xs, ys, marker="o", linestyle="--" if name.startswith("emulated") else "-",
                label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("length of the P·V sum (keys)")
    ax.set_ylabel("relative error vs float64")
    ax.set_title(f"FP8 P·V accumulation: {result['device']}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m fp8eval.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--emulate", action="store_true", help="the reference engine's emulated curves only (CPU)")
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="comma-separated sum lengths (default powers of 2 from 1024 to 1048576; to 131072 "
                         "with --emulate)")
    ap.add_argument("--seeds", type=int, default=None, help="inputs per length (default 3; 1 with --emulate)")
    ap.add_argument("--fit", action="store_true",
                    help="GPU: also find the emulated accumulator model and width closest to the hardware "
                         "(1k-128k)")
    ap.add_argument("--bits", type=int, default=None,
                    help="emulated accumulator fraction bits (default: the reference engine's FAST_ACC_BITS)")
    ap.add_argument("--align", choices=("products", "sum"), default=None,
                    help="emulated accumulator model: what a k-step aligns and truncates (default: the reference "
                         "engine's FAST_ACC_ALIGN)")
    ap.add_argument("--out", type=Path, default=None, help="run dir (default outputs/probe/<time>)")
    # Hydra-style spellings too (probe.emulate=true, lengths=1024,2048), as the other fp8eval apps take them.
    return ap.parse_args(key_value_flags(argv, ap, prefixes=("probe",)))


def _e(x) -> str:
    return "-" if x is None else f"{x:.3e}"


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    try:
        lengths = args.lengths or (EMULATE_LENGTHS if args.emulate else DEFAULT_LENGTHS)
        seeds = args.seeds or (1 if args.emulate else 3)
        result = probe(lengths, args.emulate, seeds, args.bits, fit=args.fit and not args.emulate,
                       align=args.align)
    except NoFP8GPU as e:
        print(f"fp8eval.probe: {e}, so the hardware FP8 accumulation cannot be measured here. Run it on a GPU "
              "with FP8 tensor cores, or `python -m fp8eval.probe --emulate` for the reference engine's "
              "emulated curve on this machine.", file=sys.stderr)
        return 2
    out = args.out or Path("outputs/probe") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    try:
        plot(result, out / "probe.png")
    except ImportError as e:
        print(f"fp8eval.probe: no plot ({e})", file=sys.stderr)
    names = list(result["rel_error"])
    print(f"{'length':>9} " + " ".join(f"{n:>20}" for n in names))
    for i, n in enumerate(result["lengths"]):
        print(f"{n:>9} " + " ".join(f"{_e(result['rel_error'][k][i]):>20}" for k in names))
    print(f"({result['seconds']} s on {result['device']})")
    print(out)
    return 0


if __name__ == "__main__":
    guard_std_streams()  # every line printed, Hydra's errors included, is redacted (fp8eval.core.secrets)
    sys.exit(main())
