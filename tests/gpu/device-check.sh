#!/usr/bin/env bash
# Device check: on a machine with a GPU, build the CUDA path for that GPU, run the
# GPU tests and every lab on CUDA and on the CPU, and FAIL unless everything ran
# and every number is within its bound. Written for one H200 and 16 cores: the
# whole script is meant to end within 7 minutes.
#
#   bash tests/gpu/device-check.sh            (from the repository root)
#
# 1. preflight: GPU name, driver, MIG mode, compute mode, nvcc, NCCL, MPI versions;
#    fails at once without a GPU.
# 2. configure and build BUILD for the GPU's own architecture only (nvidia-smi's
#    compute_cap), with JOBS jobs.
# 3. tests/gpu/device_check.py: the planned runs, in parallel (see its docstring),
#    with PL_REQUIRE_GPU=1 for the tests (a test finding no GPU fails), and
#    tests/gpu/check_results.py's verdict: bounds on whole loss arrays, device and
#    comm of every record, and any run skipped for budget or reported "skipped"
#    counts as a failure.
#
# Everything (this log, each run's log and record, results.json, summary.md) goes to
# $OUT when it is set, else to BUILD/device-check. Exit 0 only if all passed.
# Knobs (environment): BUILD [build-gpu], JOBS [nproc], STEPS [10], BUDGET [390]
# seconds from the start after which no further run starts (the rest fail).
set -uo pipefail

BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
STEPS=${STEPS:-10}
BUDGET=${BUDGET:-390}
DEADLINE=$(($(date +%s) + BUDGET))
RESULTS=${OUT:-$BUILD/device-check}
mkdir -p "$RESULTS"
exec > >(tee "$RESULTS/device-check.log") 2>&1

section() { printf '\n==================== %s (%ds) ====================\n' "$*" "$SECONDS"; }
give_up() { # WHAT: a step without which nothing else can be checked
    printf 'FAILED: %s\n' "$*"
    printf '# Device check\n\nFAILED: %s (see device-check.log)\n' "$*" >"$RESULTS/summary.md"
    exit 1
}

section "preflight"
command -v nvidia-smi >/dev/null || give_up "no nvidia-smi: not a GPU machine"
nvidia-smi --query-gpu=index,name,driver_version,compute_cap,mig.mode.current,compute_mode,memory.total \
    --format=csv || give_up "nvidia-smi cannot query the GPU"
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
[ -n "$CAP" ] || give_up "no compute capability from nvidia-smi"
MODE=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | head -n 1)
[ "$MODE" = "Default" ] || echo "WARNING: compute mode '$MODE': runs of 2 ranks on one GPU need 'Default'"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
echo "nvcc: $("$NVCC" --version | tail -n 2 | tr '\n' ' ')"
NCCL_H=$(dirname "$NVCC")/../include/nccl.h
echo "NCCL (header): $(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$NCCL_H" 2>/dev/null | awk '{printf "%s%s", sep, $3; sep="."}')"
echo "MPI: $( (mpichversion 2>/dev/null || mpirun --version 2>&1) | head -n 2 | tr '\n' ' ')"
SANITIZER=$(command -v compute-sanitizer || ls "$(dirname "$NVCC")/compute-sanitizer" 2>/dev/null)
echo "compute-sanitizer: ${SANITIZER:-not found} $([ -n "$SANITIZER" ] && "$SANITIZER" --version | tail -n 1)"
echo "cores: $(nproc) | $(python3 --version) | $(cmake --version | head -n 1)"
echo "architecture built: sm_$CAP | steps per run: $STEPS | no run starts after ${BUDGET}s"

section "configure ($BUILD, CUDA on, sm_$CAP only)"
cmake -B "$BUILD" -DPL_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CAP" \
    -DCMAKE_CUDA_COMPILER="$NVCC" >"$RESULTS/configure.log" 2>&1 || { tail -n 30 "$RESULTS/configure.log"; give_up "cmake configure"; }
tail -n 3 "$RESULTS/configure.log"

section "build"
cmake --build "$BUILD" -j "$JOBS" >"$RESULTS/build.log" 2>&1 || { tail -n 40 "$RESULTS/build.log"; give_up "build"; }
grep -iE 'warning' "$RESULTS/build.log" | head -n 20 || true
NCCL_SO=$(ldd "$BUILD/lab01_dp" | awk '/libnccl/ {print $3}')
echo "NCCL (runtime, $NCCL_SO): $(python3 -c "
import ctypes, sys
v = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print(v.value)" "$NCCL_SO" 2>/dev/null || echo '?')"

section "runs (progress: one line per finished run)"
python3 "$(dirname "$0")/device_check.py" --build "$BUILD" --out "$RESULTS" --steps "$STEPS" \
    --jobs "$JOBS" --deadline "$DEADLINE"
rc=$?
section "done: exit $rc; logs, records, results.json and summary.md in $RESULTS"
exit $rc
