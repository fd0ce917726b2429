#!/usr/bin/env bash
# The bubble of every schedule against its theory as the micro-batches grow.
#
# Runs lab04 at p = 2 stages (one per core on a 2-core machine) with a model
# large enough that compute dominates the sends, for each schedule and m, and
# prints each rank's measured bubble (1 - busy/wall over the steps after the
# first, from the run record) beside the schedule's formula evaluated on the
# measured t_F, t_B, t_W of the same run, and beside the unit-time textbook
# figure; then the step time against 1f1b's at the same m.
#
# usage: lab04_1f1b/bubble_table.sh [BUILD_DIR] [extra lab04 flags...]
#   e.g. lab04_1f1b/bubble_table.sh build --steps 12
# Knobs (environment): RANKS [2], MICRO ["2 4 8 16"],
#   SCHEDULES ["gpipe 1f1b interleaved zb-h1 zb-v"],
#   MODEL ["--layers 8 --d-model 256 --heads 8 --seq 64 --batch 32 --steps 8"]
# A schedule that cannot run at some m (zb-v needs m >= 2p-1) is left out.
# Other programs running on the same cores steal time from one stage and show
# up as extra bubble: run it on a quiet machine, and repeat it to see the spread.
set -euo pipefail
BUILD=${1:-build}
shift || true
RANKS=${RANKS:-2}
MICRO=${MICRO:-"2 4 8 16"}
SCHEDULES=${SCHEDULES:-"gpipe 1f1b interleaved zb-h1 zb-v"}
MODEL=${MODEL:-"--layers 8 --d-model 256 --heads 8 --seq 64 --batch 32 --steps 8"}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OPENBLAS_NUM_THREADS=1

echo "mpirun -n $RANKS $BUILD/lab04_1f1b $MODEL --micro-batches M --schedule S $*"
for m in $MICRO; do
    for s in $SCHEDULES; do
        # shellcheck disable=SC2086
        if ! mpirun -n "$RANKS" "$BUILD/lab04_1f1b" $MODEL --micro-batches "$m" --schedule "$s" --out "$OUT" "$@" \
            >/dev/null 2>"$OUT/err"; then
            echo "  m=$m $s: not run ($(head -n 1 "$OUT/err"))"
        fi
    done
done
python3 - "$OUT/records.jsonl" <<'EOF'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
p = recs[0]["ranks"]
base = {r["micro_batches"]: r["step_ms_median"] for r in recs if r["schedule"] == "1f1b"}
print(f"\n{'m':>3} {'schedule':>11} {'textbook':>8} {'formula':>7}  " +
      "  ".join(f"{'rank ' + str(q):>7}" for q in range(p)) +
      f"  {'max |diff|':>10}  {'t_F':>6} {'t_B':>6} {'t_W':>6} ms  {'step ms':>8}  {'/ 1f1b':>6}")
for r in sorted(recs, key=lambda r: (r["micro_batches"], r["schedule"])):
    meas, f = r["bubble"]["measured"], r["bubble_formula"]
    t = [1e3 * r[k] for k in ("t_forward_s", "t_backward_s", "t_weight_s")]
    ratio = r["step_ms_median"] / base[r["micro_batches"]] if r["micro_batches"] in base else float("nan")
    print(f"{r['micro_batches']:>3} {r['schedule']:>11} {r['bubble']['theory']:8.3f} {f:7.3f}  " +
          "  ".join(f"{b:7.3f}" for b in meas) + f"  {max(abs(b - f) for b in meas):10.3f}  " +
          " ".join(f"{x:6.1f}" for x in t) + f"     {r['step_ms_median']:8.1f}  {ratio:6.3f}")
print("\ntextbook: unit times (t_F = t_B = t_W); formula: the schedule's formula on the run's own measured times\n"
      "(gpipe/1f1b/interleaved do not depend on them; zb-h1 (p-1)max(t_F,t_B,t_F+t_B-t_W); zb-v its lists simulated);\n"
      "t_B is the whole backward where the schedule does not split it.")
EOF
