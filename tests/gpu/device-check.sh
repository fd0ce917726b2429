#!/usr/bin/env bash
# Device check: on a machine with a GPU, build the CUDA path for that GPU and run
# the plan of tests/gpu/device_check.py in three phases (A: the GPU alone; B: the
# lab matrix; C: the ctests and compute-sanitizer), and FAIL unless everything ran
# and every number is within its bound. Written for the short slot: one GPU, one
# command of at most 600 s; everything ends by the hard end (480 s from the start).
#
#   source tests/gpu/kit-setup.sh && bash tests/gpu/device-check.sh     (repository root)
#   bash tests/gpu/device-check.sh --rehearse     no GPU: the CPU runs only (rehearse.sh)
#
# 1. preflight: GPU name, driver, MIG and compute mode, /dev/shm, nvcc, the NCCL and
#    cuBLAS libraries found, MPI, compute-sanitizer; fails at once without a GPU.
# 2. configure and build BUILD for the GPU's own architecture only (nvidia-smi's
#    compute_cap), with JOBS jobs; a rehearsal builds only the targets its runs need.
# 3. tests/gpu/device_check.py: the phases; after each one results.json, summary.md
#    and logs.tar.gz are rewritten in OUT, so a check cut short still has a verdict.
#
# OUT (what comes back; default BUILD/device-check) holds 4 files: device-check.log
# (this log), summary.md, results.json and logs.tar.gz (every run's log and record,
# configure.log, build.log). Working files go to WORK [BUILD/device-check-work].
# Knobs (environment): BUILD [build-gpu], JOBS [nproc], STEPS [10], HARD_END [480]
# seconds from the start by which everything has ended, CUDA_ARCH [the GPU's; a
# rehearsal: 90], PL_CMAKE_ARGS (more -D options for the configure). Exit 0 only if all passed.
set -uo pipefail

REHEARSE=0 REHEARSE_FLAG=()
[ "${1:-}" = "--rehearse" ] && REHEARSE=1 REHEARSE_FLAG=(--rehearse)
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
STEPS=${STEPS:-10}
HARD_END=${HARD_END:-480}
HARD_END_AT=$(($(date +%s) + HARD_END))
RESULTS=${OUT:-$BUILD/device-check}
WORK=${WORK:-$BUILD/device-check-work}
mkdir -p "$RESULTS" "$WORK"
RESULTS=$(cd "$RESULTS" && pwd)
WORK=$(cd "$WORK" && pwd)
exec > >(tee "$RESULTS/device-check.log") 2>&1

section() { printf '\n==================== %s (%ds) ====================\n' "$*" "$SECONDS"; }
left() { echo $((HARD_END_AT - $(date +%s))); }
give_up() { # WHAT: a step without which nothing else can be checked
    printf 'FAILED: %s\n' "$*"
    printf '# Device check\n\nFAILED before any run: %s (device-check.log says more; logs.tar.gz holds configure.log and build.log)\n' \
        "$*" >"$RESULTS/summary.md"
    printf '{"runs": [], "notes": ["FAILED before any run: %s"]}\n' "$*" >"$RESULTS/results.json"
    local logs
    logs=$(cd "$WORK" && ls -- *.log 2>/dev/null)
    [ -z "$logs" ] || tar -C "$WORK" -czf "$RESULTS/logs.tar.gz" --transform 's|^|device-check/|' $logs
    exit 1
}

section "preflight"
if [ $REHEARSE = 1 ]; then
    GPU_NAME="none (rehearsal)"
    CAP=${CUDA_ARCH:-90}
    echo "rehearsal: no GPU needed; the CPU runs of the plan only"
else
    command -v nvidia-smi >/dev/null || give_up "no nvidia-smi: not a GPU machine"
    nvidia-smi --query-gpu=index,name,driver_version,compute_cap,mig.mode.current,compute_mode,memory.total \
        --format=csv || give_up "nvidia-smi cannot query the GPU"
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    CAP=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')}
    [ -n "$CAP" ] || give_up "no compute capability from nvidia-smi"
    MODE=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | head -n 1)
    [ "$MODE" = "Default" ] || echo "WARNING: compute mode '$MODE': runs of 2 ranks on one GPU need 'Default'"
fi
echo "/dev/shm (MPI's shared memory between ranks): $(df -h /dev/shm | tail -n 1)"
SHM_MB=$(df -m --output=size /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ')
[ "${SHM_MB:-0}" -ge 1024 ] || echo "WARNING: /dev/shm is ${SHM_MB:-?} MiB (a container's default is 64): runs of 2 ranks may fail in MPI's shared memory"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_ON=ON
if [ -x "$NVCC" ]; then
    echo "nvcc: $("$NVCC" --version | tail -n 2 | tr '\n' ' ')"
else
    [ $REHEARSE = 1 ] || give_up "no nvcc (not on PATH, not in /usr/local/cuda/bin)"
    CUDA_ON=OFF
    echo "nvcc: none: the rehearsal configures with CUDA off"
fi
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
NCCL_ROOT=${PL_NCCL_ROOT:-$CUDA_ROOT}
echo "NCCL: library $(ls "$NCCL_ROOT"/lib*/libnccl.so* 2>/dev/null | tr '\n' ' ')| header $(ls "$NCCL_ROOT"/include/nccl.h 2>/dev/null) $(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$NCCL_ROOT/include/nccl.h" 2>/dev/null | awk '{printf "%s%s", sep, $3; sep="."}')${PL_NCCL_ROOT:+ (PL_NCCL_ROOT)}"
echo "cuBLAS: $(ls "$CUDA_ROOT"/lib*/libcublas.so.* "$CUDA_ROOT"/targets/*/lib/libcublas.so.* 2>/dev/null | head -n 1)"
echo "MPI: $(command -v mpiexec) $( (mpichversion 2>/dev/null || mpirun --version 2>&1) | head -n 2 | tr '\n' ' ')"
SANITIZER=$(command -v compute-sanitizer || ls "$CUDA_ROOT/bin/compute-sanitizer" 2>/dev/null)
echo "compute-sanitizer: ${SANITIZER:-not found} $([ -n "$SANITIZER" ] && "$SANITIZER" --version | tail -n 1)"
echo "cores: $(nproc) | $(python3 --version) | $(cmake --version | head -n 1) | generator ${CMAKE_GENERATOR:-default}"
echo "architecture built: sm_$CAP | steps per run: $STEPS | hard end at ${HARD_END}s"

section "configure ($BUILD, CUDA $CUDA_ON, sm_$CAP only)"
timeout "$(left)" cmake -B "$BUILD" -DPL_CUDA=$CUDA_ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CAP" \
    -DCMAKE_CUDA_COMPILER="$NVCC" ${PL_CMAKE_ARGS:-} >"$WORK/configure.log" 2>&1 || { tail -n 30 "$WORK/configure.log"; give_up "cmake configure"; }
grep -E 'parallel-labs|MPI_C|Found' "$WORK/configure.log" | head -n 12

section "build"
TARGETS=()
if [ $REHEARSE = 1 ]; then
    read -r -a TARGETS < <(python3 "$HERE/device_check.py" --build "$BUILD" --out "$RESULTS" --work "$WORK" --rehearse --targets)
    echo "targets the rehearsal's runs need: ${TARGETS[*]}"
    TARGETS=(--target "${TARGETS[@]}")
fi
timeout "$(left)" cmake --build "$BUILD" -j "$JOBS" "${TARGETS[@]}" >"$WORK/build.log" 2>&1 ||
    { tail -n 40 "$WORK/build.log"; give_up "build"; }
grep -iE 'warning' "$WORK/build.log" | head -n 20 || true
echo "lab01_dp loads:"
ldd "$BUILD/lab01_dp" | grep -E 'nccl|cublas|cudart|mpich|openblas|jansson|ucx|hwloc' | sed 's/^/  /'
NCCL_SO=$(ldd "$BUILD/lab01_dp" | awk '/libnccl/ {print $3}')
[ -n "$NCCL_SO" ] && echo "NCCL (runtime, $NCCL_SO): $(python3 -c "
import ctypes, sys
v = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print(v.value)" "$NCCL_SO" 2>/dev/null || echo '?')"

section "runs: phases A, B, C (one line per finished run; hard end in $(left) s)"
# the runs end by the hard end on their own; this is the backstop
timeout -k 5 "$(($(left) + 30))" python3 "$HERE/device_check.py" --build "$BUILD" --out "$RESULTS" --work "$WORK" \
    --steps "$STEPS" --jobs "$JOBS" --hard-end "$HARD_END_AT" --gpu "$GPU_NAME" "${REHEARSE_FLAG[@]}"
rc=$?
section "done: exit $rc; $(ls "$RESULTS" | tr '\n' ' ')in $RESULTS"
exit $rc
