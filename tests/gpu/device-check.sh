#!/usr/bin/env bash
# Device check: build with CUDA, run the GPU tests, then run every lab briefly on
# CUDA and on the CPU and compare their final losses.
#
# Run from the repository root on a machine with a GPU (written for one H200 and
# 16 cores):   bash tests/gpu/device-check.sh
# It continues past a failing step so one run shows everything, prints a summary,
# and exits 1 if anything failed. Knobs (environment): BUILD [build-gpu],
# JOBS [16], STEPS [10], RANKS ["1 2"], RUN_TIMEOUT [120] seconds per mpirun,
# BUDGET [420] seconds after which remaining lab runs are skipped.
#
# A new lab needs nothing here: every build-gpu/lab0* program is run with
# `run_lab NAME`. A lab that needs flags of its own gets a case in run_all_labs
# (run_lab NAME ARGS...; the token {n} in ARGS becomes the rank count).
set -euo pipefail

BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-16}
STEPS=${STEPS:-10}
RANKS=${RANKS:-"1 2"}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
BUDGET=${BUDGET:-420}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILED=()
SUMMARY=()

section() { printf '\n==================== %s ====================\n' "$*"; }
fail() { FAILED+=("$*"); printf 'FAILED: %s\n' "$*"; }

# The last value of a numeric member of the last record in a records.jsonl.
record_number() { # FILE KEY
    tail -n 1 "$1" | sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p"
}
# The last element of the "losses" array of the last record.
record_final_loss() { # FILE
    tail -n 1 "$1" | sed -n 's/.*"losses":\[\([^]]*\)\].*/\1/p' | tr ',' '\n' | tail -n 1 | tr -d ' '
}

# One run of a lab: prints its tok/s lines and final loss, and sets LAST_LOSS
# (empty when the run failed).
run_once() { # NAME DEVICE RANKS ARGS...
    local name=$1 device=$2 n=$3
    shift 3
    local out="$TMP/$name-$device-n$n" log="$TMP/$name-$device-n$n.log"
    local args=()
    for a in "$@"; do args+=("${a//\{n\}/$n}"); done
    mkdir -p "$out"
    LAST_LOSS=""
    printf -- '--- %s --device %s, %s rank(s) ---\n' "$name" "$device" "$n"
    local rc=0
    OPENBLAS_NUM_THREADS=1 timeout -k 10 "$RUN_TIMEOUT" \
        mpirun -n "$n" "./$BUILD/$name" --device "$device" --steps "$STEPS" --out "$out" \
        ${args[@]+"${args[@]}"} >"$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        tail -n 20 "$log"
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            fail "$name $device n=$n: timed out after ${RUN_TIMEOUT}s"
        else
            fail "$name $device n=$n: exit status $rc"
        fi
        return 0
    fi
    grep -E 'device|comm' "$log" | head -n 2 || true
    grep -E 'tok/s' "$log" | tail -n 2 || true
    local rec
    rec=$(find "$out" -name records.jsonl | head -n 1)
    if [ -z "$rec" ]; then
        fail "$name $device n=$n: no records.jsonl under --out"
        return 0
    fi
    LAST_LOSS=$(record_final_loss "$rec")
    local tps ms
    tps=$(record_number "$rec" tokens_per_s)
    ms=$(record_number "$rec" step_ms_median)
    printf 'record: final loss %s | %s tok/s | median step %s ms\n' "${LAST_LOSS:-?}" "${tps:-?}" "${ms:-?}"
    SUMMARY+=("$(printf '%-12s %-5s n=%s  loss %-10s  %s tok/s' "$name" "$device" "$n" "${LAST_LOSS:-?}" "${tps:-?}")")
    [ -n "$LAST_LOSS" ] || fail "$name $device n=$n: no losses in the record"
}

# A lab on CUDA and on the CPU for each rank count; prints the loss differences.
run_lab() { # NAME ARGS...
    local name=$1
    shift
    section "$name${*:+ $*}"
    if [ ! -x "./$BUILD/$name" ]; then
        fail "$name: ./$BUILD/$name not built"
        return 0
    fi
    local n cuda_loss cpu_loss first_cuda="" first_n=""
    for n in $RANKS; do
        if [ "$SECONDS" -ge "$BUDGET" ]; then
            echo "budget of ${BUDGET}s spent: skipping $name n=$n"
            SUMMARY+=("$(printf '%-12s skipped n=%s (budget)' "$name" "$n")")
            continue
        fi
        run_once "$name" cuda "$n" "$@"
        cuda_loss=$LAST_LOSS
        run_once "$name" cpu "$n" "$@"
        cpu_loss=$LAST_LOSS
        if [ -n "$cuda_loss" ] && [ -n "$cpu_loss" ]; then
            awk -v a="$cuda_loss" -v b="$cpu_loss" -v n="$n" -v lab="$name" 'BEGIN {
                d = a - b; if (d < 0) d = -d
                printf "%s n=%s: final loss cuda %s cpu %s |diff| %.3g (rel %.3g)\n", lab, n, a, b, d, d / (b == 0 ? 1 : (b < 0 ? -b : b)) }'
        fi
        # Every layout trains on the same tokens: n ranks should match n=1 closely.
        if [ -z "$first_n" ]; then
            first_n=$n first_cuda=$cuda_loss
        elif [ -n "$cuda_loss" ] && [ -n "$first_cuda" ]; then
            awk -v a="$cuda_loss" -v b="$first_cuda" -v n="$n" -v m="$first_n" -v lab="$name" 'BEGIN {
                d = a - b; if (d < 0) d = -d
                printf "%s cuda: final loss n=%s vs n=%s |diff| %.3g\n", lab, n, m, d }'
        fi
    done
}

run_all_labs() {
    local prog name
    for prog in "./$BUILD"/lab0*; do
        if [ ! -f "$prog" ] || [ ! -x "$prog" ]; then continue; fi
        name=$(basename "$prog")
        case "$name" in
            # Labs needing their own flags go here; {n} becomes the rank count.
            lab02_*) for stage in 1 2 3; do run_lab "$name" --zero-stage $stage; done ;;
            lab06_*) run_lab "$name" --tp 1 --pp {n} --dp 1; run_lab "$name" --tp 1 --pp 1 --dp {n} ;;
            *) run_lab "$name" ;;
        esac
    done
}

section "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "(no nvidia-smi)"
echo "cores: $(nproc)"

section "configure ($BUILD, CUDA on)"
cmake -B "$BUILD" -DPL_CUDA=ON -DCMAKE_BUILD_TYPE=Release || { fail "cmake configure"; exit 1; }

section "build"
cmake --build "$BUILD" -j "$JOBS" || { fail "cmake build"; exit 1; }

section "ctest -L gpu"
ctest --test-dir "$BUILD" -L gpu --output-on-failure || fail "ctest -L gpu"

run_all_labs

section "summary (${SECONDS}s)"
printf '%s\n' ${SUMMARY[@]+"${SUMMARY[@]}"}
if [ "${#FAILED[@]}" -gt 0 ]; then
    printf 'FAILED: %s\n' "${FAILED[@]}"
    exit 1
fi
echo "all device checks passed"
