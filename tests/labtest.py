"""Run labs under mpirun and read their run records: the helpers the lab tests share.

Every test asserts on the numbers a lab wrote to its run record (records.jsonl),
never on the console text, except the bad-input tests, which check what a user
sees: the exit status and the one-line message."""
import json
import os
import subprocess
import sys
import tempfile
import time

MPIRUN = os.environ.get("MPIRUN", "mpirun")
BUILD = os.environ.get("BUILD_DIR", os.getcwd())

# Runs with --experts that --dry-run (test_cluster.py dry_run) and plan3d --check (test_plan3d.py check) must
# predict exactly: lab01, lab02 at every ZeRO stage, lab03, lab04's one-chunk, interleaved and zero-bubble
# schedules; top-2 and top-1, --capacity-factor 0 and 1, fp32 and bf16, --recompute selective and full;
# shared experts (with fine-grained ones, and under the B/W split with full recomputation).
# (lab, ranks, flags) on top of a test's tiny model; lab04's 4 micro-batches divide a batch of 8.
EXPERTS_LAYOUTS = [
    ("lab01_dp", 2, ["--experts", "4"]),
    ("lab02_zero", 2, ["--zero-stage", "1", "--experts", "4", "--top-k", "1", "--capacity-factor", "1"]),
    ("lab02_zero", 2, ["--zero-stage", "2", "--experts", "4", "--capacity-factor", "1"]),
    ("lab02_zero", 2, ["--zero-stage", "3", "--experts", "4", "--precision", "bf16", "--shared-experts", "2",
                       "--expert-width", "24"]),
    ("lab03_pp_naive", 2, ["--experts", "4", "--top-k", "1", "--recompute", "selective"]),
    ("lab04_1f1b", 2, ["--micro-batches", "4", "--experts", "4", "--capacity-factor", "1"]),
    ("lab04_1f1b", 2, ["--micro-batches", "4", "--schedule", "interleaved", "--layers", "4", "--experts", "4",
                       "--top-k", "1"]),
    ("lab04_1f1b", 2, ["--micro-batches", "4", "--schedule", "zb-v", "--layers", "4", "--experts", "4",
                       "--recompute", "full", "--capacity-factor", "1", "--shared-experts", "1"]),
]

# lab01's --grad-accum K that --dry-run and plan3d --check must predict exactly (th_run.grad_accum): the
# activations and scratch of one micro-batch of B/(N K) rows, the all-reduce once a step; with experts under a
# per-sequence capacity, and in bf16 with --recompute selective. On a batch of 8 over 2 ranks: 2 and 1 rows.
GRAD_ACCUM_LAYOUTS = [
    ("lab01_dp", 2, ["--grad-accum", "2", "--experts", "4", "--capacity-factor", "1"]),
    ("lab01_dp", 2, ["--grad-accum", "4", "--precision", "bf16", "--recompute", "selective"]),
]


def program(name):
    return os.path.join(BUILD, name)


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON (a strict reader refuses it)")


def strict_json(text, where):
    """json.loads that refuses NaN and Infinity, which Python's json accepts but JSON has not."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as e:
        fail(f"{where} is not strict JSON: {e}")


def on_cpu_unless_named(args):
    """`args`, with `--device cpu` added unless they name a device: the lab tests'
    bounds are calibrated on the CPU, so on a machine with a GPU `auto` must not
    move them there; the GPU tests say `--device cuda` themselves."""
    if any(a == "--device" or a.startswith("--device=") for a in args):
        return list(args)
    return [*args, "--device", "cpu"]


def run(lab, n, args, timeout=600, check=True, out=None):
    """Run `mpirun -n n ./lab args --out OUT` (a new temporary folder unless given) and
    return (record, completed process, OUT); on the CPU unless args name a --device."""
    out = out or tempfile.mkdtemp(prefix="pl-test-")
    cmd = [MPIRUN, "-n", str(n), program(lab), *on_cpu_unless_named(args), "--out", out]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    elapsed = time.time() - t0
    print(f"$ {' '.join(cmd)}  ->  status {p.returncode} in {elapsed:.1f} s", flush=True)
    if check and p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
        fail(f"{lab} -n {n} exited with {p.returncode}")
    rec = None
    path = os.path.join(out, "records.jsonl")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        records = [strict_json(line, f"{path} line {i + 1}") for i, line in enumerate(lines)]
        if records:
            rec = records[-1]
            # the Chrome trace is JSON too, written by the same library
            if os.path.exists(rec.get("trace", "")):
                with open(rec["trace"], encoding="utf-8") as f:
                    strict_json(f.read(), rec["trace"])
    return rec, p, out


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def max_rel_diff(a, b):
    check(len(a) == len(b), f"different number of steps: {len(a)} vs {len(b)}")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def compare_losses(name, got, ref, rtol):
    d = max_rel_diff(got, ref)
    print(f"{name}: {len(got)} steps, max relative loss difference {d:.2e} (bound {rtol:g}); "
          f"loss {ref[0]:.4f} -> {ref[-1]:.4f}", flush=True)
    check(d <= rtol, f"{name}: losses differ by {d:.3e} > {rtol:g}")
    return d


# bf16 gradients carry 8 significant bits (a relative rounding of up to 2^-9 = 2e-3
# each), and two layouts sum them in different orders: their norms differ by up to
# ~5e-4 (measured: lab01 -n 2 against -n 1, 4.9e-4 over 20 steps). A constant error
# in the gradient's scale, the fault the norm is compared for, moves it by far more.
BF16_GRAD_NORM_RTOL = 2e-3


def compare_runs(name, got, ref, rtol, ref_from=0, ref_to=None, grad_rtol=None):
    """Two runs' records step by step: the losses and the gradient's norm before
    clipping (`grad_norms`), both within rtol. The norm is what catches a gradient
    off by a constant factor (a loss weighted by the wrong token count): clipping
    rescales such a gradient and AdamW is invariant to its scale, so the losses
    alone would still agree. got holds ref's steps [ref_from, ref_to) (a resume, a
    shorter run). grad_rtol: the norms' bound when it is not rtol (bf16 runs)."""
    grad_rtol = rtol if grad_rtol is None else grad_rtol
    compare_losses(name, got["losses"], ref["losses"][ref_from:ref_to], rtol)
    g, r = got["grad_norms"], ref["grad_norms"][ref_from:ref_to]
    d = max_rel_diff(g, r)
    print(f"{name}: max relative gradient-norm difference {d:.2e} (bound {grad_rtol:g}); "
          f"norm {r[0]:.4g} -> {r[-1]:.4g}", flush=True)
    check(d <= grad_rtol, f"{name}: gradient norms before clipping differ by {d:.3e} > {grad_rtol:g}")
    return d


_startup = {}


def startup_seconds(lab, n):
    """How long n ranks of `lab` take to start, print --help and leave (measured once per lab and n)."""
    if (lab, n) not in _startup:
        t0 = time.time()
        subprocess.run([MPIRUN, "-n", str(n), program(lab), "--help"], capture_output=True, timeout=120,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        _startup[(lab, n)] = time.time() - t0
    return _startup[(lab, n)]


def check_rejected(lab, n, args, needle, shell_prefix=""):
    """A bad input: every rank exits 2 within 5 s of start-up, one line `error: ...` naming `needle`, no output.
    shell_prefix: shell commands each rank runs first (e.g. a cd of its own)."""
    # each rank reports its own exit status, so "all ranks exit 2" is observed, not assumed
    out = "" if "--out" in args else f' --out "{tempfile.mkdtemp()}"'
    script = f'{shell_prefix}"$0" "$@"{out}; echo "rank-exit $?" >&2'
    cmd = [MPIRUN, "-n", str(n), "sh", "-c", script, program(lab), *args]
    # 5 s beyond the time the same ranks take to start and leave (--help): the loader maps
    # cuBLAS, NCCL and oneDNN into every rank, which alone took 2-4.4 s for 8 ranks on 2 busy cores
    bound = 5 + startup_seconds(lab, n)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=bound, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    except subprocess.TimeoutExpired:
        fail(f"{args}: no answer within {bound:.1f} s (a hang; start-up alone takes {bound - 5:.1f} s)")
    dt = time.time() - t0
    exits = [l for l in p.stderr.splitlines() if l.startswith("rank-exit")]
    msgs = [l for l in p.stderr.splitlines() if l and not l.startswith("rank-exit")]
    shown = " ".join(a if len(a) <= 100 else f"{a[:60]}...({len(a)} characters)" for a in args)
    print(f"-n {n} {shown} -> {[m[:300] for m in msgs]} exits {[e.split()[1] for e in exits]} in {dt:.1f} s")
    check(exits == ["rank-exit 2"] * n, f"{args}: every rank must exit with 2, got {exits}")
    check(len(msgs) == 1, f"{args}: expected one line of message, got {msgs}")
    check(msgs[0].startswith("error: ") and needle in msgs[0], f"{args}: message must name {needle!r}: {msgs[0]!r}")
    check(p.stdout == "", f"{args}: nothing should run before the error, stdout was {p.stdout!r}")


def has_gpu(lab):
    """Whether `lab` can run on CUDA here (a GPU and a CUDA build)."""
    rec, p, _ = run(lab, 1, ["--steps", "1", "--layers", "1", "--device", "cuda"], check=False)
    return p.returncode == 0


def require_gpu():
    """PL_REQUIRE_GPU=1 (tests/gpu/device-check.sh sets it): a GPU test that finds
    no GPU fails instead of being skipped, so a CUDA crash at start-up cannot pass
    as "no GPU"."""
    return os.environ.get("PL_REQUIRE_GPU", "") not in ("", "0")


def skip_without_gpu(lab):
    """Exit 77 (CTest: skipped) unless `lab` runs on CUDA here; with
    PL_REQUIRE_GPU=1 a failed probe is a failure, its output shown."""
    rec, p, _ = run(lab, 1, ["--steps", "1", "--layers", "1", "--device", "cuda"], check=False)
    if p.returncode == 0:
        return
    if require_gpu():
        print(p.stdout[-2000:], p.stderr[-2000:], sep="\n")
        fail(f"PL_REQUIRE_GPU=1: {lab} --device cuda exited with {p.returncode}")
    print("no GPU: skipped")
    sys.exit(77)


# ---- activation bytes, derived here from the model's shapes (not read from the labs) ----

def _pad(floats):
    """common/model.c carves every piece 64-byte aligned: whole 16-float units."""
    return (floats + 15) // 16 * 16


def layer_acts_bytes(B, T, C, H, t=1, sp=False, recompute="none"):
    """One layer of one micro-batch of B rows, as a TP rank of t keeps it for the
    backward. Inside the TP regions N = B T positions at H/t heads and 4C/t MLP
    units; on the residual stream N/t under sequence parallelism. Kept: ln1, ln2
    [N,C] (under SP the all-gathered inputs of the column-parallel matmuls) and
    their mean, rstd [Ns]; qkv, atty; att [B,H/t,T,T]; res2, res3 [Ns,C]; fch,
    fch_gelu. selective drops att, full keeps res3 alone."""
    N = B * T
    Ns = N // t if sp else N
    attn, mlp = C // t, 4 * C // t
    att = _pad(B * (H // t) * T * T)
    rest = (2 * (_pad(N * C) + 2 * _pad(Ns)) + _pad(N * 3 * attn) + _pad(N * attn) + 2 * _pad(Ns * C)
            + 2 * _pad(N * mlp))
    return 4 * {"none": rest + att, "selective": rest, "full": _pad(Ns * C)}[recompute]


def acts_bytes(B, T, C, H, L, V=256, lo=0, hi=None, t=1, sp=False, recompute="none"):
    """Layers [lo, hi) of one micro-batch, with what is not per layer: x_in
    [Ns,C]; the first stage's tokens [Ns]; the last stage's targets, losses
    [Ns], lnf [Ns,C] + its mean, rstd, logits and probs [Ns,V]."""
    hi = L if hi is None else hi
    Ns = B * T // t if sp else B * T
    other = _pad(Ns * C) + (_pad(Ns) if lo == 0 else 0)
    if hi == L:
        other += 4 * _pad(Ns) + _pad(Ns * C) + 2 * _pad(Ns * V)
    return (hi - lo) * layer_acts_bytes(B, T, C, H, t, sp, recompute) + 4 * other


def check_acts(rec, want, what):
    """The allocator's activation peak per rank == the lab's formula (theory.h)
    == want (a list per rank, derived by the test)."""
    measured, formula = rec["mem_peak_bytes_per_rank"]["acts"], rec["acts_peak_bytes_formula_per_rank"]
    check(measured == formula == want, f"{what}: activation peaks measured {measured}, theory.h {formula}, "
                                       f"test's formula {want}")
