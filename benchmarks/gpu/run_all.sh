#!/usr/bin/env bash
# The GPU verification of docs/gpu.md, one stage per call of the device tool (each under 10 minutes):
#
#   benchmarks/gpu/run_all.sh tests   # 6-9 min: environment, shared-GPU probe, python -m pytest -m cuda
#   benchmarks/gpu/run_all.sh runs    # about 6 min: ringtrain check / train on the GPU, GPU step benchmark
#   benchmarks/gpu/run_all.sh sweep   # about 8.5 min: ringtrain bench at 1, 2, 4, 8 CPU ranks (GPUs hidden)
#
# PYTEST_ARGS adds to the tests stage's pytest line (e.g. "tests/gpu -n 6": the GPU tests on 6 xdist
# workers, when the whole verification must fit one call); SKIP_STEPS names steps to leave out
# (e.g. "step-bench").
#
# Every stage stops itself within BUDGET seconds (default 550). Add --quick for a smoke run of the same
# steps (on a machine without a GPU: --device cpu everywhere, short runs).
# Results go to $OUT (the device tool's folder): <stage>.log (everything printed),
# <stage>-summary.json (each step's command, exit code, seconds) and <stage>.tar.gz (every file), plus
# the main result files themselves. No network is needed: ringtrain runs from src/ (PYTHONPATH).
# Outside the device tool, OUT defaults to ${TMPDIR:-/tmp}/ringtrain-gpu-out.
set -u -o pipefail

STAGE=${1:-}
QUICK=0
[ "${2:-}" = "--quick" ] && QUICK=1
case "$STAGE" in tests|runs|sweep) ;; *) echo "usage: $0 tests|runs|sweep [--quick]" >&2; exit 2 ;; esac

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-${TMPDIR:-/tmp}/ringtrain-gpu-out}
PY=${PYTHON:-python3}
PY=$(command -v "$PY")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ringtrain-$STAGE.XXXXXX")
mkdir -p "$OUT"
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
# `ringtrain` by name, for `ringtrain run ... ringtrain check` (the package is not installed there)
mkdir -p "$WORK/bin"
printf '#!/bin/sh\nexec "%s" -m ringtrain "$@"\n' "$PY" > "$WORK/bin/ringtrain"
chmod +x "$WORK/bin/ringtrain"
export PATH="$WORK/bin:$PATH"

DEVICE=cuda
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    DEVICE=cpu
    [ $QUICK = 1 ] || { echo "torch sees no GPU here: use --quick for the CPU smoke run" >&2; exit 2; }
fi
START=$(date +%s)
# the whole stage ends within BUDGET seconds (the device tool stops a command at 600): each step's limit
# is cut to what is left
BUDGET=${BUDGET:-550}
STEPS="$WORK/steps.jsonl"
: > "$STEPS"
exec > >(tee "$OUT/$STAGE.log") 2>&1
TEE=$!

# step NAME SECONDS COMMAND...: run with a time limit (shell functions without one), log its output,
# record its exit code
step() {
    local name=$1 limit=$2
    shift 2
    local began code left
    began=$(date +%s)
    left=$(( BUDGET - (began - START) - 40 ))
    if [[ " ${SKIP_STEPS:-} " == *" $name "* ]]; then
        echo "=== $name: skipped (SKIP_STEPS)"
        printf '{"step": "%s", "skipped": true}\n' "$name" >> "$STEPS"
        return
    fi
    if [ "$left" -lt 20 ]; then
        echo "=== $name: skipped, ${left}s of the stage's ${BUDGET}s left"
        printf '{"step": "%s", "skipped": true}\n' "$name" >> "$STEPS"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
    if declare -F "$1" > /dev/null; then
        "$@" 2>&1 | tee "$WORK/$name.log"
    else
        timeout -s INT -k 30 "$limit" "$@" 2>&1 | tee "$WORK/$name.log"
    fi
    code=${PIPESTATUS[0]}
    echo "=== $name: exit $code after $(( $(date +%s) - began ))s"
    "$PY" -c 'import json, sys; print(json.dumps({"step": sys.argv[1], "exit_code": int(sys.argv[2]),
"seconds": int(sys.argv[3]), "command": sys.argv[4:]}))' "$name" "$code" "$(( $(date +%s) - began ))" "$@" \
        >> "$STEPS"
}

environment() {
    echo "stage $STAGE, device $DEVICE, quick $QUICK, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi 2>/dev/null || echo "nvidia-smi: not here"
    nproc; free -g 2>/dev/null | head -2
    "$PY" - <<'EOF'
import platform, torch, torch.distributed as dist
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuDNN", torch.backends.cudnn.version(), "| gloo", dist.is_gloo_available(),
      "| nccl", dist.is_nccl_available() and torch.cuda.is_available() and torch.cuda.nccl.version())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i}", p.name, f"{p.total_memory / 2**30:.1f} GiB", "sm", f"{p.major}.{p.minor}", "uuid",
          getattr(p, "uuid", "?"))
EOF
}

if [ "$STAGE" = tests ]; then
    step environment 60 environment
    step probe 150 "$PY" benchmarks/gpu/probe_shared_gpu.py --device "$DEVICE" --out "$WORK"
    cp "$WORK/probe_shared_gpu.json" "$OUT/" 2>/dev/null
    # one line runs every GPU test; on a CPU machine (--quick) they skip with their reason
    step pytest-cuda $(( QUICK ? 120 : 460 )) "$PY" -m pytest -m cuda -p no:cacheprovider -rA \
        --continue-on-collection-errors --timeout 300 --junitxml="$WORK/pytest-cuda.xml" ${PYTEST_ARGS:-}
    cp "$WORK/pytest-cuda.xml" "$OUT/" 2>/dev/null
fi

if [ "$STAGE" = runs ]; then
    step environment 60 environment
    if [ $QUICK = 1 ]; then SUBSET=(--subset 1000); EPOCHS=1; RESNET=(--subset 128 --batch-size 16); else
        SUBSET=(); EPOCHS=2; RESNET=(--batch-size 128); fi
    step check-1 120 ringtrain check --device "$DEVICE"
    step check-2 180 ringtrain run -np 2 ringtrain check --device "$DEVICE"
    step train-mnist 180 ringtrain train mnist --device "$DEVICE" --epochs "$EPOCHS" ${SUBSET[@]+"${SUBSET[@]}"} \
        --no-progress --results-json "$WORK/train-mnist.json"
    step train-mnist-np2-horovod-amp 180 ringtrain train mnist -np 2 --device "$DEVICE" --strategy horovod \
        --amp --epochs "$EPOCHS" ${SUBSET[@]+"${SUBSET[@]}"} --no-progress --results-json "$WORK/train-mnist-np2.json"
    step train-resnet18-amp 180 ringtrain train synthetic --arch resnet18 --amp --device "$DEVICE" \
        --epochs "$EPOCHS" "${RESNET[@]}" --no-progress --results-json "$WORK/train-resnet18.json"
    if [ $QUICK = 1 ]; then
        step step-bench 300 "$PY" benchmarks/gpu/step_bench_gpu.py --device "$DEVICE" --quick --out "$WORK"
    else
        step step-bench 330 "$PY" benchmarks/gpu/step_bench_gpu.py --device cuda --rounds 10 --out "$WORK"
    fi
    cp "$WORK"/gpu_step_bench_*.json "$WORK"/gpu_step_bench_*.md "$OUT/" 2>/dev/null
fi

if [ "$STAGE" = sweep ]; then
    step environment 60 environment
    # the sweep paces itself to what is left of the stage (it interrupts a sweep that would overrun)
    SWEEP_S=$(( BUDGET - ($(date +%s) - START) - 90 ))
    step cpu-sweep $(( SWEEP_S + 45 )) "$PY" benchmarks/gpu/cpu_sweep.py --budget-s "$SWEEP_S" \
        --out "$WORK/sweep" $([ $QUICK = 1 ] && echo --quick)
    cp "$WORK/sweep/cpu_sweep.json" "$OUT/" 2>/dev/null
fi

"$PY" - "$STEPS" "$OUT/$STAGE-summary.json" "$STAGE" "$DEVICE" "$QUICK" "$(( $(date +%s) - START ))" <<'EOF'
import json, sys
steps_file, out, stage, device, quick, seconds = sys.argv[1:]
steps = [json.loads(line) for line in open(steps_file) if line.strip()]
body = {"stage": stage, "device": device, "quick": quick == "1", "seconds": int(seconds), "steps": steps,
        "failed": [s["step"] for s in steps if s.get("exit_code", 0) != 0],
        "skipped": [s["step"] for s in steps if s.get("skipped")]}
open(out, "w").write(json.dumps(body, indent=1) + "\n")
print(f"stage {stage}: {len(steps)} steps in {seconds}s; failed: {body['failed'] or 'none'}; "
      f"skipped for time: {body['skipped'] or 'none'}")
EOF
tar -czf "$OUT/$STAGE.tar.gz" -C "$WORK" --exclude ./bin . 2>/dev/null
ls -la "$OUT"
exec 1>&- 2>&-
wait "$TEE"  # the log is complete before the command returns
rm -rf "$WORK"
