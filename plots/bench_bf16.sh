#!/usr/bin/env bash
# --precision bf16 against fp32, measured in one run so the ratios are fair:
#  1. memory per rank (rank 0, bytes by the allocator) of lab01 -n 1, lab02
#     stages 1-3 at -n 4 and lab05 at t = 2, fp32 and bf16 (one step measures
#     memory exactly), with plan3d --check holding every record to theory/'s
#     formula for its precision, category by category;
#  2. the GEMM rate of each CPU path at the default model's shapes: fp32 sgemm
#     against bf16 through oneDNN and through convert + sgemm (bench_bf16_gemm);
#  3. lab01 -n 1, the default model: tok/s of fp32 and of bf16 on each GEMM
#     path, REPEATS rounds alternating the three, medians and ratios;
#  4. where the step's time goes: lab01 -n 1 with PL_KERNEL_TIMES=1 (common/
#     kernel_times.h), fp32 and bf16 alternating, ms per step by kernel kind
#     (GEMM, attention, LayerNorm, GELU, softmax/loss, optimizer, conversions,
#     ...) side by side, medians over the rounds.
# usage: plots/bench_bf16.sh [BUILD_DIR] [PARTS]   (default: build, "1 2 3 4";
#        REPEATS=3 STEPS=6; e.g. plots/bench_bf16.sh build 4 for the breakdown alone)
set -euo pipefail
BUILD=${1:-build}
PARTS=" ${2:-1 2 3 4} "
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-6}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

if [[ $PARTS == *" 1 "* ]]; then
echo "== 1. memory per rank (rank 0), fp32 against bf16; formula: plan3d --check"
for prec in fp32 bf16; do
    mpirun -n 1 "$BUILD/lab01_dp" --steps 1 --precision $prec --out "$OUT/mem-$prec" >/dev/null
    for s in 1 2 3; do
        mpirun -n 4 "$BUILD/lab02_zero" --steps 1 --zero-stage $s --precision $prec --out "$OUT/mem-$prec" >/dev/null
    done
    mpirun -n 2 "$BUILD/lab05_tp" --steps 1 --precision $prec --out "$OUT/mem-$prec" >/dev/null
done
python3 - "$OUT" <<'PY'
import json, sys
rows = {}
for prec in ("fp32", "bf16"):
    for line in open(f"{sys.argv[1]}/mem-{prec}/records.jsonl"):
        r = json.loads(line)
        m = {k: v[0] for k, v in r["mem_peak_bytes_per_rank"].items()}
        rows.setdefault(f"{r['lab']} {r['layout']}", {})[prec] = m
print(f"{'run':24s} {'prec':4s} {'params':>10s} {'grads':>10s} {'optim':>10s} {'states':>10s} {'acts':>11s}  states bf16/fp32  acts bf16/fp32")
for name, p in rows.items():
    for prec in ("fp32", "bf16"):
        m = p[prec]
        st = m["params"] + m["grads"] + m["optim"]
        ratio = ""
        if prec == "bf16":
            f = p["fp32"]
            ratio = f"  {st / (f['params'] + f['grads'] + f['optim']):.3f}            {m['acts'] / f['acts']:.3f}"
        print(f"{name:24s} {prec:4s} {m['params']:10d} {m['grads']:10d} {m['optim']:10d} {st:10d} {m['acts']:11d}{ratio}")
PY
for prec in fp32 bf16; do "$BUILD/plan3d" --check "$OUT/mem-$prec" | grep -E "^lab|checked"; done
fi

if [[ $PARTS == *" 2 "* ]]; then

echo "== 2. GEMM rates, one thread (bf16/fp32 in the same process)"
for path in onednn sgemm; do PL_BF16_GEMM=$path "$BUILD/bench_bf16_gemm"; done
fi

if [[ $PARTS == *" 3 "* ]]; then

echo "== 3. lab01 -n 1, default model, $STEPS steps: tok/s (median step), $REPEATS rounds"
for r in $(seq "$REPEATS"); do
    mpirun -n 1 "$BUILD/lab01_dp" --steps "$STEPS" --out "$OUT/fp32" >/dev/null
    for path in onednn sgemm; do
        PL_BF16_GEMM=$path mpirun -n 1 "$BUILD/lab01_dp" --steps "$STEPS" --precision bf16 --out "$OUT/bf16-$path" >/dev/null
    done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
def tps(name):
    return [json.loads(l)["tokens_per_s"] for l in open(f"{sys.argv[1]}/{name}/records.jsonl")]
f = tps("fp32")
print(f"fp32        tok/s {' '.join(f'{x:.0f}' for x in f)} | median {statistics.median(f):.0f}")
for path in ("onednn", "sgemm"):
    b = tps(f"bf16-{path}")
    ratios = [x / y for x, y in zip(b, f)]
    print(f"bf16 {path:6s} tok/s {' '.join(f'{x:.0f}' for x in b)} | median {statistics.median(b):.0f} | "
          f"bf16/fp32 per round {' '.join(f'{x:.2f}' for x in ratios)}, median {statistics.median(ratios):.2f}")
PY
fi

if [[ $PARTS == *" 4 "* ]]; then
echo "== 4. lab01 -n 1, default model, $STEPS steps: ms per step by kernel kind (PL_KERNEL_TIMES=1), $REPEATS rounds"
for r in $(seq "$REPEATS"); do
    PL_KERNEL_TIMES=1 mpirun -n 1 "$BUILD/lab01_dp" --steps "$STEPS" --out "$OUT/kt-fp32" >/dev/null
    PL_KERNEL_TIMES=1 mpirun -n 1 "$BUILD/lab01_dp" --steps "$STEPS" --precision bf16 --out "$OUT/kt-bf16" >/dev/null
done
python3 - "$OUT" "$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)" <<'PY'
import json, statistics, sys
runs = {p: [json.loads(l) for l in open(f"{sys.argv[1]}/kt-{p}/records.jsonl")] for p in ("fp32", "bf16")}
kinds = list(runs["fp32"][0]["kernel_ms_per_step"])
med = {p: {k: statistics.median(r["kernel_ms_per_step"][k] for r in rs) for k in kinds} for p, rs in runs.items()}
step = {p: statistics.median(r["step_ms_median"] for r in rs) for p, rs in runs.items()}
ratio = statistics.median(b["tokens_per_s"] / f["tokens_per_s"] for f, b in zip(runs["fp32"], runs["bf16"]))
def line(name, f, b):
    print(f"{name:14s} {f:9.1f} {b:9.1f}   {b / f if f > 0 else float('nan'):6.2f}")
print(f"ms per step    {'fp32':>9s} {'bf16':>9s}   bf16/fp32   (medians of {len(runs['fp32'])} rounds; {sys.argv[2]})")
for k in kinds:
    line(k, med["fp32"][k], med["bf16"][k])
nongemm = {p: sum(v for k, v in med[p].items() if k != "gemm") for p in med}
line("not gemm", nongemm["fp32"], nongemm["bf16"])
line("whole step", sum(med["fp32"].values()), sum(med["bf16"].values()))
print(f"median step (ms) fp32 {step['fp32']:.1f}, bf16 {step['bf16']:.1f}; tok/s bf16/fp32 per round, median {ratio:.2f}")
whole = {p: sum(med[p].values()) for p in med}
print(f"ceiling: fp32 step / bf16 GEMMs alone = {whole['fp32'] / med['bf16']['gemm']:.2f} (bf16/fp32 if nothing but the "
      f"linear layers' GEMMs took time); with attention too: {whole['fp32'] / (med['bf16']['gemm'] + med['bf16']['attention']):.2f}")
# The best this CPU allows, whatever the non-GEMM kernels do: attention's products as fast, relative to
# fp32, as the linear layers' GEMMs, and every other kernel at half its fp32 time (bf16 halves the bytes
# a memory-bound kernel moves, and these kernels do no more arithmetic per byte in bf16).
gemm_ratio = med["fp32"]["gemm"] / med["bf16"]["gemm"]
rest = whole["fp32"] - med["fp32"]["gemm"] - med["fp32"]["attention"]
best = med["bf16"]["gemm"] + med["fp32"]["attention"] / gemm_ratio + rest / 2
print(f"bound: GEMMs bf16/fp32 {gemm_ratio:.2f}x here; attention at that ratio and every other kernel at half its "
      f"fp32 time would give {whole['fp32'] / best:.2f}x")
print("(timed calls: each bracketed by a trace event, a few percent slower than a plain run; part 3 has the plain tok/s)")
PY
fi
grep -m1 -o "avx512_bf16\|amx_bf16" /proc/cpuinfo || echo "(this CPU has no avx512_bf16 / amx_bf16)"
