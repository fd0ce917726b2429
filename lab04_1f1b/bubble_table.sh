#!/usr/bin/env bash
# The bubble against the theory (p-1)/(m+p-1) as the micro-batches grow.
#
# Runs lab04 at p = 2 stages (one per core on a 2-core machine) with a model
# large enough that compute dominates the sends, for m = 1, 2, 4, 8, 16, and
# prints each rank's measured bubble (1 - busy/wall over the steps after the
# first, from the run record) beside the theory.
#
# usage: lab04_1f1b/bubble_table.sh [BUILD_DIR] [extra lab04 flags...]
#   e.g. lab04_1f1b/bubble_table.sh build --schedule gpipe
# Knobs (environment): RANKS [2], MICRO ["1 2 4 8 16"],
#   MODEL ["--layers 8 --d-model 256 --heads 8 --seq 64 --batch 32 --steps 8"]
# Other programs running on the same cores steal time from one stage and show
# up as extra bubble: run it on a quiet machine, and repeat it to see the spread.
set -euo pipefail
BUILD=${1:-build}
shift || true
RANKS=${RANKS:-2}
MICRO=${MICRO:-"1 2 4 8 16"}
MODEL=${MODEL:-"--layers 8 --d-model 256 --heads 8 --seq 64 --batch 32 --steps 8"}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OPENBLAS_NUM_THREADS=1

echo "mpirun -n $RANKS $BUILD/lab04_1f1b $MODEL --micro-batches M $*"
for m in $MICRO; do
    # shellcheck disable=SC2086
    mpirun -n "$RANKS" "$BUILD/lab04_1f1b" $MODEL --micro-batches "$m" --out "$OUT" "$@" >/dev/null
done
python3 - "$OUT/records.jsonl" <<'EOF'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
p = recs[0]["ranks"]
print(f"\n{'m':>3} {'schedule':>8} {'theory':>7}  " + "  ".join(f"{'rank ' + str(r):>7}" for r in range(p))
      + f"  {'max |diff|':>10}  {'step ms':>8}")
for r in recs:
    th, meas = r["bubble"]["theory"], r["bubble"]["measured"]
    print(f"{r['micro_batches']:>3} {r['schedule']:>8} {th:7.3f}  " + "  ".join(f"{b:7.3f}" for b in meas)
          + f"  {max(abs(b - th) for b in meas):10.3f}  {r['step_ms_median']:8.1f}")
EOF
