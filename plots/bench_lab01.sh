#!/usr/bin/env bash
# The foundation's speed, measured in one run so the ratios are fair:
#  1. single-thread sgemm GFLOP/s (the yardstick),
#  2. lab01 at one rank, --layers 4 --d-model 128 --heads 4 --seq 64 --batch 8:
#     tok/s and model FLOP/s as a fraction of the yardstick (target >= 50 %),
#  3. lab01 at -n 1 and -n 2 with the default model: the speed-up of two ranks
#     on two cores (target >= 1.8x).
# usage: plots/bench_lab01.sh [BUILD_DIR]   (default: build)
set -euo pipefail
BUILD=${1:-build}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OPENBLAS_NUM_THREADS=1

field() { # RECORDS KEY -> the last record's number
    python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])" "$1" "$2"
}

line=$("$BUILD/bench_sgemm")
echo "$line"
yard=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) GFLOP.*/\1/p')

mpirun -n 1 "$BUILD/lab01_dp" --layers 4 --d-model 128 --heads 4 --seq 64 --batch 8 --steps 30 \
    --out "$OUT/small" >/dev/null
tps=$(field "$OUT/small/records.jsonl" tokens_per_s)
flops=$(field "$OUT/small/records.jsonl" model_flops_per_s)
python3 -c "
tps, flops, yard = $tps, $flops, $yard
print(f'lab01 -n 1, L4 C128 T64 B8: {tps:,.0f} tok/s, {flops/1e9:.1f} GFLOP/s model compute '
      f'= {100*flops/1e9/yard:.0f}% of single-thread sgemm ({yard:.1f} GFLOP/s)')"

for n in 1 2; do
    mpirun -n $n "$BUILD/lab01_dp" --steps 20 --out "$OUT/n$n" >/dev/null
done
t1=$(field "$OUT/n1/records.jsonl" tokens_per_s)
t2=$(field "$OUT/n2/records.jsonl" tokens_per_s)
python3 -c "
t1, t2 = $t1, $t2
print(f'lab01 default model: -n 1 {t1:,.0f} tok/s, -n 2 {t2:,.0f} tok/s: speed-up {t2/t1:.2f}x (median step times)')"
