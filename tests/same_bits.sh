#!/usr/bin/env bash
# tests/same_bits.sh BASE: does this tree compute exactly what commit BASE does?
#
# Builds BASE (in a temporary git worktree) and this working tree (CPU, Release),
# runs the same small cases with both and compares, per case:
#   - the losses, as hex floats (records.jsonl keeps them with 17 digits: exact)
#   - every other number of the run record but the clocks (traffic bytes and calls,
#     allocator peaks per category and rank, the formulas beside them, ...)
#   - the saved checkpoint, byte for byte
# A refactor that changes a single bit of any of them fails here.
#
#   tests/same_bits.sh main          # or any commit; exit 0: all identical
#   KEEP=1 tests/same_bits.sh main   # keep the scratch folder to look at
set -euo pipefail
base=${1:?usage: tests/same_bits.sh BASE (a commit to compare this tree with)}
here=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d /tmp/same_bits.XXXXXX)
cleanup() {
    git -C "$here" worktree remove --force "$scratch/base-src" >/dev/null 2>&1 || true
    [ -n "${KEEP:-}" ] && echo "kept $scratch" || rm -rf "$scratch"
}
trap cleanup EXIT

git -C "$here" worktree add --detach "$scratch/base-src" "$base" >/dev/null 2>&1
build() { # src dir -> build dir
    cmake -S "$1" -B "$2" -G Ninja -DPL_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
    ninja -C "$2" lab01_dp lab02_zero lab03_pp_naive lab04_1f1b lab05_tp lab06_3d lab07_cp lab08_ep lab09_5d >/dev/null
}
build "$scratch/base-src" "$scratch/base-build"
build "$here" "$scratch/this-build"

export OPENBLAS_NUM_THREADS=1
model=(--layers 4 --d-model 32 --heads 4 --seq 16 --batch 8 --steps 3 --eval)
# name | ranks | program | flags
cases=(
    "lab01|1|lab01_dp|"
    "lab01_experts|1|lab01_dp|--experts 4 --capacity-factor 1.0"
    "lab08|2|lab08_ep|"
    "lab08_ep2x2|4|lab08_ep|--ep 2 --top-k 1"
    "lab02_zero3|2|lab02_zero|--zero-stage 3"
    "lab03|2|lab03_pp_naive|"
    "lab04_zbv|2|lab04_1f1b|--schedule zb-v --micro-batches 4"
    "lab04_interleaved|2|lab04_1f1b|--schedule interleaved --virtual-stages 2 --micro-batches 4"
    "lab04_zbv_full|2|lab04_1f1b|--schedule zb-v --micro-batches 4 --recompute full"
    "lab05_sp|2|lab05_tp|--sequence-parallel"
    "lab05_selective|2|lab05_tp|--recompute selective"
    "lab06_sp_full|4|lab06_3d|--tp 2 --pp 2 --dp 1 --sequence-parallel --recompute full"
    "lab06_sp_zbv|4|lab06_3d|--tp 2 --pp 2 --dp 1 --sequence-parallel --schedule zb-v"
    "lab06_zbv_selective|4|lab06_3d|--tp 2 --pp 2 --dp 1 --schedule zb-v --recompute selective"
    "lab07_ring|2|lab07_cp|"
    "lab09_tp2_cp2|4|lab09_5d|--tp 2 --cp 2 --pp 1 --dp 1 --micro-batches 2"
    "lab09_cp2_pp2_ulysses|4|lab09_5d|--tp 1 --cp 2 --pp 2 --dp 1 --cp-algo ulysses --micro-batches 2"
    "lab09_experts|4|lab09_5d|--experts 4 --ep 2 --tp 1 --cp 1 --pp 2 --dp 2 --micro-batches 2"
)
run_side() { # side case ranks program flags precision
    local out="$scratch/$1/$2_$6"
    mkdir -p "$out"
    # shellcheck disable=SC2086
    (cd "$out" && mpirun -n "$3" "$scratch/$1-build/$4" "${model[@]}" $5 --precision "$6" \
        --out runs --save ck.safetensors >stdout.txt 2>&1) || { echo "FAIL: $1 $2 $6 exited non-zero"; cat "$out/stdout.txt"; return 1; }
}

# the record without its clocks, losses as hex floats
strip_record() {
    python3 - "$1" <<'EOF'
import json, sys
rec = json.loads(open(sys.argv[1]).read().splitlines()[-1])
# read off a clock (or derived from one: lab04's bubble formula takes the measured
# tF, tB, tW), or naming a host or a file
CLOCKS = {"seconds", "measured", "bubble_formula", "trace", "timeline", "host", "tokens_per_s",
          "model_flops_per_s", "step_ms", "step_ms_median", "compute_fraction", "comm_fraction",
          # lab07's ring hiding condition and attention times, lab08's all-to-all and expert times
          "attention_seconds_per_rank", "ring_flops_per_s", "ring_bytes_per_s", "ring_block_seconds",
          "ring_message_seconds", "ring_hidden", "alltoall_ms_per_step", "experts_ms_per_step"}
# the flight recorder's settings and its check's cost (common/flight.h): no result, and
# absent from the records of trees before it; grad_norms, absent before stop 39 (the
# losses' bits, compared above, change with any change of the gradients anyway); th_run,
# the config theory predicted from (labs/th_run_json.h), a run's input, absent before stop 42
NOT_RESULTS = {"flight", "grad_norms", "th_run"}
def keep(k):
    return k not in CLOCKS and k not in NOT_RESULTS and not (k.startswith("t_") and k.endswith("_s"))
# keys an older tree wrote beside acts_peak_bytes_formula_per_rank for the same
# figure (lab03/04/06 and lab05 under their own names): dropped only when they
# equal it, so a difference still shows
DUPLICATES = {"acts_peak_formula_bytes", "acts_bytes_formula"}
same = rec.get("acts_peak_bytes_formula_per_rank")
for k in DUPLICATES & rec.keys():
    if rec[k] == same or (same and rec[k] == same[0]):
        del rec[k]
def walk(v):
    if isinstance(v, dict):
        return {k: walk(x) for k, x in v.items() if keep(k)}
    if isinstance(v, list):
        return [walk(x) for x in v]
    if isinstance(v, float):
        return v.hex()
    return v
print(json.dumps(walk(rec), indent=1, sort_keys=True))
EOF
}

fails=0
for c in "${cases[@]}"; do
    IFS='|' read -r name ranks prog flags <<<"$c"
    for prec in fp32 bf16; do
        run_side base "$name" "$ranks" "$prog" "$flags" "$prec" || { fails=$((fails + 1)); continue; }
        run_side this "$name" "$ranks" "$prog" "$flags" "$prec" || { fails=$((fails + 1)); continue; }
        b="$scratch/base/${name}_$prec" t="$scratch/this/${name}_$prec"
        strip_record "$b/runs/records.jsonl" >"$b/record.txt"
        strip_record "$t/runs/records.jsonl" >"$t/record.txt"
        what=""
        cmp -s "$b/record.txt" "$t/record.txt" || what="$what record"
        cmp -s "$b/ck.safetensors" "$t/ck.safetensors" || what="$what checkpoint"
        if [ -n "$what" ]; then
            echo "DIFFERS: $name $prec:$what"
            diff "$b/record.txt" "$t/record.txt" | head -20 || true
            fails=$((fails + 1))
        else
            echo "same: $name $prec ($(python3 -c "import json,sys;print(' '.join(float(x).hex() for x in json.loads(open(sys.argv[1]).read().splitlines()[-1])['losses']))" "$t/runs/records.jsonl"))"
        fi
    done
done
[ "$fails" = 0 ] && echo "same_bits: every case identical to $base" || { echo "same_bits: $fails case(s) differ from $base"; exit 1; }
