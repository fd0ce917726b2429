#!/usr/bin/env python3
"""The runs of the device check (tests/gpu/device-check.sh calls this after the
build), in three phases, most valuable first; after each phase results.json,
summary.md and logs.tar.gz (every run's log and record) are rewritten in --out,
so that a check cut short still says what it found. Nothing runs past --hard-end:
every run's time limit is cut to what is left before it.

A. the GPU alone: test_gpu_kernels against the CPU twins; lab01 -n 1 on CUDA
   (NCCL) beside the CPU, whole loss arrays; gpt2-small (--preset) in fp32, then
   bf16, each alone on the GPU (nothing else runs meanwhile) for tok/s, model
   FLOP/s and MFU, beside plan3d's prediction for the same model on one GPU.
B. the lab matrix on CUDA and the CPU at 1 and 2 ranks (2 ranks share the GPU:
   MPI staged through host memory; --comm nccl -n 2 must be refused): every lab
   and layout against lab01 -n 1 on CUDA (1e-5) and against its CPU twin (1e-3);
   --check-sync; bf16; sequence parallelism; recomputation (the same numbers);
   the pipeline schedules; --bucket-mb; PL_CUDA_SYNC=1; gpt2-small's width and
   length at 2 layers on both devices; checkpoints saved on one device, resumed on
   the other; lab07's CP algorithms (ring, allgather, ulysses) at 1 and 2 ranks, and
   in bf16; lab08 (experts, the CPU only): --device auto must pick the CPU and
   match lab01 -n 1 --experts 4, --device cuda must be refused in one line.
C. every ctest labelled gpu (PL_REQUIRE_GPU=1: no GPU is a failure), and
   compute-sanitizer memcheck, racecheck and synccheck on test_gpu_kernels --small.

--rehearse keeps a handful of the plan's CPU runs (REHEARSAL), for
tests/gpu/rehearse.sh on a machine without a GPU; --targets prints the build
targets the selected runs need; --list prints the plan (each phase's runs, their
commands and what they must give, then the comparisons and their bounds) and runs
nothing; --plan-file runs a plan written as JSON (the CTest of the phase logic).

usage: device_check.py --build DIR --out DIR [--work DIR] [--steps N] [--jobs N]
                       [--hard-end EPOCH] [--gpu NAME] [--rehearse] [--targets] [--list] [--plan-file F]"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_results  # noqa: E402
from check_results import PHASES, G2_RUN, PLAN_RUN  # noqa: E402

# Bounds, and why (the CPU tests' bounds, for the same reasons):
# CUDA vs CPU, same lab and layout: cuBLAS sums in another order than OpenBLAS; ~1e-7
# relative per sum, which AdamW's normalised steps carry into the weights. The CPU
# labs' CUDA tests use 1e-3 over 20 steps.
CUDA_VS_CPU = 1e-3
# CUDA at 2 ranks (or another lab) vs lab01 -n 1 on CUDA: the layout changes only the
# order of reductions (ranks' partial sums, TP's split GEMMs); the CPU tests bound
# every lab against lab01 -n 1 by 1e-5 over 20 steps (measured 6e-9 .. 1e-6).
LAYOUT = 1e-5
# The same command twice on the same device: no atomics anywhere, so equal bits.
SAME = 0.0
# bf16 (--precision bf16) against fp32, or CUDA's bf16 against the CPU's: each
# rounding to bf16 is 2^-8 relative, and the two sides round in different places
# (cuBLAS writes the attention scores in bf16, the CPU keeps them fp32), which
# training carries like the bf16-vs-fp32 difference that the CPU tests bound by 2 %
# at every step (tests/test_bf16.py).
BF16_VS_OTHER = 2e-2
# a bf16 layout against bf16 lab01 -n 1 on the same device: tests/test_bf16.py's BOUND
# (the order of the bf16 roundings of partial sums; measured <= 7.6e-5 on the CPU).
BF16_LAYOUT = 5e-4
# lab07's bf16 against bf16 lab01 -n 1: tests/test_lab07.py's bound. Its attention
# merges blocks by log-sum-exp in another place than lab01's one softmax, so bf16
# rounds other values (measured on the CPU, the tiny defaults over 10 steps, -n 2
# ring: 5.2e-4, over BF16_LAYOUT).
CP_BF16_LAYOUT = 2e-3
# The gpu-labelled tests there must be (any others found are run too).
EXPECTED_GPU_TESTS = ["gpu_kernels_vs_cpu"] + [f"gpu_lab0{i}_cuda" for i in range(1, 8)]
# lab08's refusal of --device cuda (common/run.c), and what --dry-run's hosts line says
# on a machine with a GPU when --device auto leaves it unused for the experts
EXPERTS_CUDA_REFUSAL = "--experts on --device cuda"
EXPERTS_GPU_UNUSED = "the GPUs it has are not used: --experts runs on the CPU only"


# The runs a rehearsal keeps (tests/gpu/rehearse.sh): CPU runs of phases A and B
# that reach MPI at 1 and 2 ranks, OpenBLAS, jansson (the records), bf16, a
# checkpoint, and plan3d's predictions.
REHEARSAL = ["lab01 cpu n1", PLAN_RUN.format("fp32"), PLAN_RUN.format("bf16"), "lab01 cpu n2",
             "lab02 s3 cpu n2", "lab06 tp2 cpu n2", "lab01 cpu n1 bf16", "lab01 cpu save@{half}",
             "lab07 ulysses cpu n2", "lab01 cpu n1 experts 4", "lab08 auto n2"]
# the build target of each program the runs start (add_lab's target names)
TARGETS = {"lab01_dp": "lab01", "lab02_zero": "lab02", "lab03_pp_naive": "lab03", "lab04_1f1b": "lab04",
           "lab05_tp": "lab05", "lab06_3d": "lab06", "lab07_cp": "lab07", "lab08_ep": "lab08", "lab09_5d": "lab09",
           "plan3d": "plan"}
# no run starts with less than this left before the hard end
MIN_START_S = 3.0
# gpt2-small's throughput runs: enough steps that the median step is a steady one
G2_STEPS = 10


class Run:
    def __init__(self, name, kind, argv, cores, timeout, env=None, expect=None, expect_exit=0,
                 expect_output=None, out=None):
        self.name, self.kind, self.argv, self.cores, self.timeout = name, kind, argv, cores, timeout
        self.env, self.expect, self.expect_exit, self.expect_output = env or {}, expect or {}, expect_exit, expect_output
        self.out = out  # the lab's --out folder (plan3d: its --json file)
        self.phase = None
        self.result = {"name": name, "kind": kind, "cmd": " ".join(argv), "status": "skipped",
                       "reason": "not started", "expect": self.expect, "expect_exit": expect_exit}
        if expect_output is not None:
            self.result["expect_output"] = expect_output


class Plan:
    def __init__(self, args):
        self.a = args
        self.phase = "A"
        self.chains = {p: [] for p in PHASES}  # per phase: lists of runs, each list run in order by one worker
        self.alone = {p: [] for p in PHASES}   # per phase: runs that run one at a time, nothing beside them
        self.compare = []
        self.notes = []
        self.missing = []  # results of planned runs that cannot even start
        self.runs_dir = os.path.join(args.work, "runs")
        self.logs_dir = os.path.join(args.work, "logs")
        self.ckpt_dir = tempfile.mkdtemp(prefix="pl-device-check-")  # big files: not in the archive
        os.makedirs(self.runs_dir, exist_ok=True)
        os.makedirs(self.logs_dir, exist_ok=True)

    def lab(self, name, prog, n, device, args, steps=None, expect=None, env=None, expect_exit=0,
            expect_output=None, timeout=150):
        """A run of ./prog under mpirun -n n on `device`; device None: no --device
        (auto), and expect names the device the lab must pick."""
        steps = self.a.steps if steps is None else steps
        out = os.path.join(self.runs_dir, slug(name))
        argv = ["mpirun", "-n", str(n), os.path.join(self.a.build, prog), *(["--device", device] if device else []),
                "--steps", str(steps), "--out", out, *args]
        picked = (expect or {}).get("device", device)
        want = {"device": picked, "steps": steps}
        if picked == "cpu":
            want["comm"] = "mpi"
        else:  # one GPU: NCCL at one rank, ranks sharing the GPU go through MPI
            want["comm"] = "nccl" if n == 1 and "--comm" not in args else "mpi"
        want.update(expect or {})
        return Run(name, "lab", argv, n, timeout, env=env, expect=want, expect_exit=expect_exit,
                   expect_output=expect_output, out=out)

    def add(self, *runs, alone=False):
        for r in runs:
            r.phase = self.phase
        if alone:
            self.alone[self.phase].extend(runs)
        else:
            self.chains[self.phase].append(list(runs))
        return runs[0] if len(runs) == 1 else runs

    def cmp(self, a, b, rtol, why, a_steps=None, b_steps=None):
        self.compare.append({"a": a.name, "b": b.name, "rtol": rtol, "why": why,
                             "a_steps": a_steps, "b_steps": b_steps, "phase": max(a.phase, b.phase)})

    def runs(self, phase=None):
        return [r for p in (PHASES if phase is None else [phase])
                for r in self.alone[p] + [r for c in self.chains[p] for r in c]]

    def keep(self, names):
        """Only the runs named (a chain keeps its named runs, in order), and the
        comparisons between them."""
        for p in PHASES:
            self.alone[p] = [r for r in self.alone[p] if r.name in names]
            self.chains[p] = [c for c in ([r for r in c if r.name in names] for c in self.chains[p]) if c]
        kept = {r.name for r in self.runs()}
        self.compare = [c for c in self.compare if c["a"] in kept and c["b"] in kept]
        self.missing = []


def slug(name):
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)


def gpu_tests(build):
    p = subprocess.run(["ctest", "--test-dir", build, "-N", "-L", "gpu"], capture_output=True, text=True)
    return re.findall(r"Test\s+#\d+:\s*(\S+)", p.stdout)  # "  Test  #8: gpu_kernels_vs_cpu"


def plan3d_run(P, precision, gpu):
    """plan3d's prediction for gpt2-small's throughput runs: the labs' model (GPT-2's
    layer, byte vocabulary, untied head: plan3d's `course` preset at gpt2-small's
    shape), one GPU, batch 8 in one micro-batch, nothing recomputed, no ZeRO."""
    cluster = "h100" if "H100" in gpu else "h200"
    out = os.path.join(P.runs_dir, slug(PLAN_RUN.format(precision)) + ".json")
    argv = [os.path.join(P.a.build, "plan3d"), "--model", "course", "--layers", "12", "--d-model", "768",
            "--heads", "12", "--seq", "1024", "--cluster", cluster, "--gpus", "1", "--global-batch", "8",
            "--micro-batch", "8", "--tp", "1", "--pp", "1", "--dp", "1", "--zero-stage", "0",
            "--recompute", "none", "--precision", precision, "--top", "1", "--json", out]
    if precision == "fp32":  # the labs' fp32 GEMMs do not use TF32: the plain FP32 peak, not plan3d's TF32 one
        argv += ["--gpu-tflops", str(check_results.peak_tflops("H200", "fp32"))]
    return Run(PLAN_RUN.format(precision), "plan3d", argv, 1, 60, out=out)


def make_plan(args):
    P = Plan(args)
    S = args.steps
    g2_shape = {"preset": "gpt2-small", "d_model": 768, "heads": 12, "seq": 1024}

    # ---- A: the GPU alone -------------------------------------------------------
    P.phase = "A"
    for precision in ("fp32", "bf16"):  # one at a time, nothing else on the GPU
        P.add(P.lab(G2_RUN.format(precision), "lab01_dp", 1, "cuda",
                    ["--preset", "gpt2-small", "--precision", precision], steps=G2_STEPS,
                    expect={"config": dict(g2_shape, layers=12, batch=8, precision=precision)}, timeout=120),
              alone=True)
    tests = gpu_tests(args.build)
    kernels_test = "gpu_kernels_vs_cpu"  # run in phase A whether listed or not (then it fails)
    for t in EXPECTED_GPU_TESTS:
        if t not in tests and t != kernels_test:  # planned, and not there: a failure like any skipped run
            P.missing.append({"name": f"ctest {t}", "kind": "ctest", "status": "skipped", "phase": "C",
                              "reason": "not listed by ctest -N -L gpu"})
    P.add(Run(f"ctest {kernels_test}", "ctest", ["ctest", "--test-dir", args.build, "-R", f"^{kernels_test}$",
                                                "--output-on-failure", "--timeout", "120"], 1, 150,
              env={"PL_REQUIRE_GPU": "1"}))
    ref = P.add(P.lab("lab01 cuda n1", "lab01_dp", 1, "cuda", []))
    cpu_ref = P.add(P.lab("lab01 cpu n1", "lab01_dp", 1, "cpu", []))
    P.cmp(ref, cpu_ref, CUDA_VS_CPU, "CUDA vs CPU")
    for precision in ("fp32", "bf16"):
        P.add(plan3d_run(P, precision, args.gpu))

    # ---- B: the lab matrix ------------------------------------------------------
    P.phase = "B"
    variants = [  # (label, program, {n: lab args}, {n: expected record keys})
        ("lab01", "lab01_dp", {2: ["--check-sync"]}, {2: {"replicas_identical": True}}),
        ("lab02 s1", "lab02_zero", {1: ["--zero-stage", "1"], 2: ["--zero-stage", "1"]}, {}),
        ("lab02 s2", "lab02_zero", {1: ["--zero-stage", "2"], 2: ["--zero-stage", "2"]}, {}),
        ("lab02 s3", "lab02_zero", {1: ["--zero-stage", "3"], 2: ["--zero-stage", "3"]}, {}),
        ("lab03", "lab03_pp_naive", {1: [], 2: []}, {}),
        ("lab04 1f1b", "lab04_1f1b", {1: [], 2: []}, {}),
        ("lab04 gpipe", "lab04_1f1b", {2: ["--schedule", "gpipe"]}, {}),
        ("lab04 zb-h1", "lab04_1f1b", {2: ["--schedule", "zb-h1"]}, {}),
        ("lab05", "lab05_tp", {1: [], 2: ["--check-sync"]}, {2: {"replicated_identical": True}}),
        ("lab05 sp", "lab05_tp", {2: ["--sequence-parallel", "--check-sync"]}, {2: {"replicated_identical": True}}),
        ("lab06 1x1x1", "lab06_3d", {1: ["--tp", "1", "--pp", "1", "--dp", "1"]}, {}),
        ("lab06 pp2", "lab06_3d", {2: ["--tp", "1", "--pp", "2", "--dp", "1"]}, {}),
        ("lab06 dp2", "lab06_3d", {2: ["--tp", "1", "--pp", "1", "--dp", "2", "--check-sync"]},
         {2: {"replicas_identical": True}}),
        ("lab06 tp2", "lab06_3d", {2: ["--tp", "2", "--pp", "1", "--dp", "1"]}, {}),
        ("lab06 tp2 sp", "lab06_3d", {2: ["--tp", "2", "--pp", "1", "--dp", "1", "--sequence-parallel"]}, {}),
    ]
    for label, prog, by_n, expects in variants:
        for n, lab_args in sorted(by_n.items()):  # lab01 -n 1: ref and cpu_ref above
            gpu = P.add(P.lab(f"{label} cuda n{n}", prog, n, "cuda", lab_args, expect=expects.get(n)))
            cpu = P.add(P.lab(f"{label} cpu n{n}", prog, n, "cpu", lab_args, expect=expects.get(n)))
            P.cmp(gpu, cpu, CUDA_VS_CPU, "CUDA vs CPU, same lab and layout")
            P.cmp(gpu, ref, LAYOUT, "every layout reproduces lab01 -n 1 (order of reductions only)")
            P.cmp(cpu, cpu_ref, LAYOUT, "on the CPU too (the CPU tests' bound)")

    # lab07, context parallelism, in its zig-zag default layout: every algorithm at 1 and 2
    # ranks (at 1 rank too each takes its own path: Ulysses' block kernel, the gather of
    # one), the mask's positions in device memory (lab07_cp/cp.c) on a GPU for the first time
    for n in (1, 2):
        for algo in ("ring", "allgather", "ulysses"):
            cp_args, want = ["--cp-algo", algo], {"cp": n, "dp": 1}
            gpu = P.add(P.lab(f"lab07 {algo} cuda n{n}", "lab07_cp", n, "cuda", cp_args, expect=want))
            cpu = P.add(P.lab(f"lab07 {algo} cpu n{n}", "lab07_cp", n, "cpu", cp_args, expect=want))
            P.cmp(gpu, cpu, CUDA_VS_CPU, "CUDA vs CPU, same lab and layout")
            P.cmp(gpu, ref, LAYOUT, "every CP algorithm reproduces lab01 -n 1 (blocks merged by log-sum-exp)")
            P.cmp(cpu, cpu_ref, LAYOUT, "on the CPU too (tests/test_lab07.py's bound)")

    # lab09: lab05's TP layer with lab07's ring attention in the same layer, in two pipeline
    # stages (4 ranks sharing the GPU: CUDA + MPI), on a GPU for the first time
    grid_args = ["--tp", "2", "--cp", "2", "--pp", "1", "--dp", "1"]
    want = {"tp": 2, "cp": 2, "pp": 1, "dp": 1}
    gpu = P.add(P.lab("lab09 tp2 cp2 cuda n4", "lab09_5d", 4, "cuda", grid_args, expect=want))
    cpu = P.add(P.lab("lab09 tp2 cp2 cpu n4", "lab09_5d", 4, "cpu", grid_args, expect=want))
    P.cmp(gpu, cpu, CUDA_VS_CPU, "CUDA vs CPU, same lab and layout")
    P.cmp(gpu, ref, LAYOUT, "TP x CP in one layer reproduces lab01 -n 1")
    P.cmp(cpu, cpu_ref, LAYOUT, "on the CPU too (tests/test_lab09.py's bound)")

    # recomputation reruns the same kernels on the same inputs: the same numbers
    for mode in ("selective", "full"):
        rc = P.add(P.lab(f"lab01 cuda n1 recompute {mode}", "lab01_dp", 1, "cuda", ["--recompute", mode]))
        P.cmp(rc, ref, SAME, f"--recompute {mode} reproduces --recompute none exactly")
    rc2 = P.add(P.lab("lab05 cuda n2 sp recompute full", "lab05_tp", 2, "cuda",
                      ["--sequence-parallel", "--recompute", "full"]))
    P.cmp(rc2, ref, LAYOUT, "SP and full recomputation together reproduce lab01 -n 1")

    # gpt2-small's width and length (C 768, 12 heads of 64, T 1024) on both devices, at
    # 2 layers and one sequence so that the CPU side takes seconds
    g2 = ["--preset", "gpt2-small", "--batch", "1", "--layers", "2"]
    g2_cpu = P.add(P.lab("gpt2-small L2 b1 cpu", "lab01_dp", 1, "cpu", g2, steps=2,
                         expect={"config": dict(g2_shape, layers=2, batch=1)}, timeout=200))
    g2_cuda = P.add(P.lab("gpt2-small L2 b1 cuda", "lab01_dp", 1, "cuda", g2, steps=2,
                          expect={"config": dict(g2_shape, layers=2, batch=1)}))
    P.cmp(g2_cuda, g2_cpu, CUDA_VS_CPU, "gpt2-small's width and T 1024: CUDA vs CPU")

    # bf16 on CUDA: against CUDA fp32, the CPU's bf16, and its own layouts
    bf16 = ["--precision", "bf16"]
    want_bf16 = {"config": {"precision": "bf16"}, "model_state_bytes_per_param":
                 {"params": 2.0, "grads": 2.0, "optim": 12.0, "formula": [2.0, 2.0, 12.0], "formula_text": "2 + 2 + 12"}}
    ref16 = P.add(P.lab("lab01 cuda n1 bf16", "lab01_dp", 1, "cuda", bf16, expect=want_bf16))
    cpu16 = P.add(P.lab("lab01 cpu n1 bf16", "lab01_dp", 1, "cpu", bf16, expect=want_bf16))
    P.cmp(ref16, ref, BF16_VS_OTHER, "bf16 follows fp32 (2 % at every step)")
    P.cmp(ref16, cpu16, BF16_VS_OTHER, "bf16: CUDA vs CPU (roundings in other places)")
    for label, prog, lab_args in (("lab02 s3", "lab02_zero", ["--zero-stage", "3"]), ("lab05", "lab05_tp", [])):
        run16 = P.add(P.lab(f"{label} cuda n2 bf16", prog, 2, "cuda", bf16 + lab_args,
                            expect={"config": {"precision": "bf16"}}))
        P.cmp(run16, ref16, BF16_LAYOUT, "a bf16 layout reproduces bf16 lab01 -n 1 (order of roundings)")
    cp16 = P.add(P.lab("lab07 ring cuda n2 bf16", "lab07_cp", 2, "cuda", bf16, expect={"config": {"precision": "bf16"}}))
    P.cmp(cp16, ref16, CP_BF16_LAYOUT, "lab07's bf16 reproduces bf16 lab01 -n 1 (tests/test_lab07.py's bound)")

    # lab08, experts: the CPU only (no CUDA twins of the router and the dispatch). With no
    # --device (auto) on this GPU machine it must pick the CPU and train as lab01 -n 1
    # --experts 4 does; --device cuda is refused in one line; --dry-run's hosts line says why
    # the GPU is left unused (not in a rehearsal: no GPU there to leave)
    moe_ref = P.add(P.lab("lab01 cpu n1 experts 4", "lab01_dp", 1, "cpu", ["--experts", "4"],
                          expect={"config": {"experts": 4}}))
    moe = P.add(P.lab("lab08 auto n2", "lab08_ep", 2, None, [], expect={"device": "cpu", "config": {"experts": 4}}))
    P.cmp(moe, moe_ref, LAYOUT, "lab08 on --device auto runs on the CPU and reproduces lab01 -n 1 --experts 4")
    P.add(P.lab("lab08 cuda n2", "lab08_ep", 2, "cuda", [], expect_exit=2, expect_output=EXPERTS_CUDA_REFUSAL))
    dry = P.lab("lab08 auto n2 dry-run", "lab08_ep", 2, None, ["--dry-run"], expect_output=EXPERTS_GPU_UNUSED)
    dry.kind = dry.result["kind"] = "dry-run"  # no record: what it prints is the check
    P.add(dry)

    # the paths no test takes
    for n in (1, 2):
        b = P.add(P.lab(f"lab01 cuda n{n} bucket-mb", "lab01_dp", n, "cuda",
                        ["--bucket-mb", "0.5", "--check-sync"], expect={"replicas_identical": True}))
        P.cmp(b, ref, LAYOUT, "buckets change when gradients are reduced, not what")
    mpi1 = P.add(P.lab("lab01 cuda n1 comm mpi", "lab01_dp", 1, "cuda", ["--comm", "mpi"]))
    P.cmp(mpi1, ref, LAYOUT, "the backend moves the same numbers")
    P.add(P.lab("lab01 cuda n2 comm nccl", "lab01_dp", 2, "cuda", ["--comm", "nccl"], expect_exit=2,
                expect_output="--comm nccl needs one GPU per rank"))
    sync = P.add(P.lab("lab01 cuda n1 PL_CUDA_SYNC", "lab01_dp", 1, "cuda", [], steps=3,
                       env={"PL_CUDA_SYNC": "1"}))
    P.cmp(sync, ref, SAME, "synchronising after every launch changes no number", b_steps=[0, 3])

    # checkpoints across devices: half the steps, save, resume on the other device
    half = S // 2
    for first, second in (("cuda", "cpu"), ("cpu", "cuda")):
        ck = os.path.join(P.ckpt_dir, f"{first}.safetensors")
        straight = ref if first == "cuda" else cpu_ref
        other = cpu_ref if first == "cuda" else ref
        save = P.lab(f"lab01 {first} save@{half}", "lab01_dp", 1, first, ["--save", ck], steps=half)
        resume = P.lab(f"lab01 {second} resume {first}@{half}", "lab01_dp", 1, second, ["--resume", ck],
                       steps=S - half, expect={"first_step": half, "resumed_from": ck})
        P.add(save, resume)
        P.cmp(save, straight, SAME, f"the same run on {first}, repeated", b_steps=[0, half])
        P.cmp(resume, straight, CUDA_VS_CPU, f"saved on {first}, continued on {second}", b_steps=[half, S])
        P.cmp(resume, other, CUDA_VS_CPU, f"continued on {second}", b_steps=[half, S])

    # ---- C: the ctests and compute-sanitizer (the longest) -------------------------
    P.phase = "C"
    for t in tests:
        if t == kernels_test:
            continue
        cores = 4 if t in ("gpu_lab04_cuda", "gpu_lab06_cuda") else 2
        P.add(Run(f"ctest {t}", "ctest", ["ctest", "--test-dir", args.build, "-R", f"^{t}$", "--output-on-failure",
                                          "--timeout", "300"], cores, 330, env={"PL_REQUIRE_GPU": "1"}))
    sanitizer = shutil.which("compute-sanitizer") or (
        "/usr/local/cuda/bin/compute-sanitizer" if os.path.exists("/usr/local/cuda/bin/compute-sanitizer") else None)
    kernels = os.path.join(args.build, "tests", "test_gpu_kernels")
    if sanitizer:
        for tool in ("memcheck", "racecheck", "synccheck"):
            P.add(Run(f"compute-sanitizer {tool}", "sanitizer",
                      [sanitizer, "--tool", tool, "--error-exitcode", "1", kernels, "--small"], 1, 300,
                      env={"PL_REQUIRE_GPU": "1"}))
    else:
        P.notes.append("compute-sanitizer not found: memcheck, racecheck and synccheck not run")

    if args.rehearse:
        P.keep({name.format(half=half) for name in REHEARSAL})
        P.notes.append("rehearsal (no GPU): only the CPU runs "
                       + ", ".join(r.name for r in P.runs()) + " of the device check's plan")
    return P


def print_plan(plan):
    """--list: the plan as it would run, nothing started."""
    for p in PHASES:
        runs = plan.runs(p)
        print(f"phase {p} ({len(runs)} runs): {check_results.PHASE_TITLES[p]}")
        for r in runs:
            want = f"exit {r.expect_exit}" + (f", prints {r.expect_output!r}" if r.expect_output else "")
            if r.kind == "lab" and r.expect_exit == 0:
                want += ", record " + ", ".join(f"{k} {v}" for k, v in r.expect.items())
            env = "".join(f"{k}={v} " for k, v in r.env.items())
            print(f"  {r.name}{' (alone)' if r in plan.alone[p] else ''}: {env}{' '.join(r.argv)}\n    must give: {want}")
    print(f"comparisons ({len(plan.compare)}): a vs b, max relative difference of the loss arrays <= bound")
    for c in plan.compare:
        steps = "" if c["a_steps"] is None and c["b_steps"] is None else f" steps {c['a_steps']} / {c['b_steps']}"
        print(f"  {c['phase']} {c['a']} vs {c['b']}{steps} <= {c['rtol']:g}: {c['why']}")
    for m in plan.missing:
        print(f"  missing: {m['name']} ({m['reason']})")
    for n in plan.notes:
        print(f"note: {n}")
    print(f"{len(plan.runs())} runs, {len(plan.compare)} comparisons")


def plan_from_file(args):
    """A plan written as JSON: {"phases": {"A": [run, ...], ...}, "compare": [...]},
    a run {"name", "argv", "kind" ("lab"), "alone" (false), "timeout" (60), "expect",
    "expect_exit" (0), "out" (the folder of its records.jsonl)}."""
    with open(args.plan_file) as f:
        spec = json.load(f)
    P = Plan(args)
    byname = {}
    for phase in PHASES:
        P.phase = phase
        for r in spec["phases"].get(phase, []):
            run = Run(r["name"], r.get("kind", "lab"), r["argv"], 1, r.get("timeout", 60), expect=r.get("expect"),
                      expect_exit=r.get("expect_exit", 0), out=r.get("out"))
            byname[run.name] = P.add(run, alone=r.get("alone", False))
    for c in spec.get("compare", []):
        P.cmp(byname[c["a"]], byname[c["b"]], c["rtol"], c.get("why", ""))
    return P


def read_record(run):
    """The run's record: a lab's last line of records.jsonl; plan3d's best layout."""
    if not run.out:
        return None
    if run.kind == "plan3d":
        if not os.path.exists(run.out):
            return None
        with open(run.out) as f:
            plan = json.load(f)
        best = next((l for l in plan.get("layouts", []) if l.get("winner")), None)
        if not best:
            return None
        return {"prediction": best["label"], "tokens_per_s": best["tokens_per_s"], "mfu": best["mfu"],
                "step_s": best["step_s"], "mem_total_bytes": best["mem_total_bytes"],
                "cluster": plan["cluster"]["name"], "efficiency": plan["cluster"]["efficiency"],
                "precision": plan["training"]["precision"], "params": plan["model"]["params"]}
    path = os.path.join(run.out, "records.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = f.read().splitlines()
    return json.loads(lines[-1]) if lines else None


def execute(run, plan, hard_end, lock, log_lines):
    """Runs one run, its time limit cut to what is left before hard_end (epoch s)."""
    r = run.result
    left = hard_end - time.time()
    if left < MIN_START_S:
        r["reason"] = "the hard end came before it started"
        return False
    limit = min(run.timeout, left)
    log = os.path.join(plan.logs_dir, slug(run.name) + ".log")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **run.env)
    t0 = time.time()
    r.update(status="error", reason="", log=os.path.relpath(log, plan.a.work), limit_s=round(limit, 1))
    try:
        with open(log, "w") as f:
            f.write("$ " + " ".join(f"{k}={v}" for k, v in run.env.items()) + " " + " ".join(run.argv) + "\n")
            f.flush()
            # its own process group, so that a timeout ends mpirun's ranks too
            p = subprocess.Popen(run.argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                r.update(status="done", exit=p.wait(timeout=limit))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                cut = limit < run.timeout
                r.update(status="timeout", reason=f"cut at the hard end after {limit:.0f} s" if cut
                         else f"its own limit of {run.timeout} s")
    except OSError as e:
        r.update(status="error", reason=str(e))
    r["seconds"] = time.time() - t0
    with open(log, errors="replace") as f:
        text = f.read()
    r["output"] = text[-4000:]
    if run.kind == "ctest" and r["status"] == "done":
        # ctest exits 0 for a skipped test: a skip here means an incomplete check
        if "***Skipped" in text or "Not Run" in text or "No tests were found" in text:
            r.update(status="skipped", reason="ctest reported it skipped / not run")
    try:
        rec = read_record(run)
    except (OSError, ValueError, KeyError) as e:
        rec, r["reason"] = None, f"{r['reason']} (record unreadable: {e})"
    if rec is not None:
        r["record"] = rec
    ok = not check_results.check_run(r)
    with lock:
        line = f"[{time.strftime('%H:%M:%S')}] {'ok    ' if ok else 'FAILED'} {run.phase} {run.name} ({r['seconds']:.1f} s)"
        print(line, flush=True)
        log_lines.append(line)
    return r["status"] == "done" and r.get("exit") == run.expect_exit


def run_phase(plan, phase, jobs, hard_end):
    """The phase's lone runs one after the other, nothing beside them; then its
    chains, each in one worker, its runs in order; a chain starts when its first
    run's cores are free (jobs cores in all). Returns by hard_end."""
    lock, free = threading.Lock(), threading.Condition()
    state = {"cores": jobs}
    log_lines, threads = [], []
    for run in plan.alone[phase]:
        execute(run, plan, hard_end, lock, log_lines)

    def worker(chain, cores):
        try:
            for i, run in enumerate(chain):
                if not execute(run, plan, hard_end, lock, log_lines):
                    for later in chain[i + 1:]:  # they need this one (its checkpoint)
                        later.result["reason"] = f"{run.name} before it did not complete"
                    break
        finally:
            with free:
                state["cores"] += cores
                free.notify_all()

    for chain in plan.chains[phase]:
        cores = min(max(r.cores for r in chain), jobs)
        with free:
            while state["cores"] < cores:
                free.wait()
            state["cores"] -= cores
        t = threading.Thread(target=worker, args=(chain, cores), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def replace(path, write):
    """Writes path through a temporary file and a rename: a kill leaves the old or the new."""
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def publish(plan, args, phases_state, started):
    """results.json, summary.md and logs.tar.gz in --out, as things stand."""
    results = {"mode": "rehearsal" if args.rehearse else "device", "gpu": args.gpu,
               "hard_end_s": round(args.hard_end - started, 1), "elapsed_s": round(time.time() - started, 1),
               "phases": phases_state, "runs": plan.missing + [r.result | {"phase": r.phase} for r in plan.runs()],
               "compare": plan.compare, "notes": plan.notes}
    path = os.path.join(args.out, "results.json")

    def dump(tmp):
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
    replace(path, dump)
    failures, text = check_results.report(results)

    def summary(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    replace(os.path.join(args.out, "summary.md"), summary)

    def archive(tmp):  # every log and record; checkpoints and traces stay behind
        with tarfile.open(tmp, "w:gz") as tar:
            for root, _, files in os.walk(args.work):
                for name in sorted(files):
                    full = os.path.join(root, name)
                    if name.endswith((".log", ".jsonl", ".json")) and os.path.getsize(full) < 4 << 20:
                        tar.add(full, arcname=os.path.join("device-check", os.path.relpath(full, args.work)))
    replace(os.path.join(args.out, "logs.tar.gz"), archive)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True, help="what comes back: results.json, summary.md, logs.tar.gz")
    ap.add_argument("--work", help="the runs' logs and records [BUILD/device-check-work]")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--hard-end", type=float, default=time.time() + 400,
                    help="epoch seconds: every run ends by then (its limit is cut), none starts after")
    ap.add_argument("--gpu", default="unknown", help="the GPU's name (nvidia-smi): the peak of its MFU")
    ap.add_argument("--rehearse", action="store_true", help="only the CPU runs of REHEARSAL (no GPU)")
    ap.add_argument("--targets", action="store_true", help="print the build targets the runs need, and exit")
    ap.add_argument("--list", action="store_true", help="print the plan (runs, commands, comparisons), run nothing")
    ap.add_argument("--plan-file", help="run this plan (JSON) instead of the device check's")
    args = ap.parse_args()
    started = time.time()
    args.build, args.out = os.path.abspath(args.build), os.path.abspath(args.out)
    args.work = os.path.abspath(args.work or os.path.join(args.build, "device-check-work"))
    plan = plan_from_file(args) if args.plan_file else make_plan(args)
    if args.targets:
        progs = {os.path.basename(a) for r in plan.runs() for a in r.argv[:4]}
        print(" ".join(sorted(TARGETS[p] for p in progs if p in TARGETS)))
        return 0
    if args.list:
        print_plan(plan)
        shutil.rmtree(plan.ckpt_dir, ignore_errors=True)
        return 0
    os.makedirs(args.out, exist_ok=True)
    state = {p: {"title": check_results.PHASE_TITLES[p], "state": "not reached"} for p in PHASES}
    print(f"{len(plan.runs())} runs, {len(plan.compare)} comparisons, {args.jobs} cores, hard end in "
          f"{max(0, args.hard_end - time.time()):.0f} s", flush=True)
    publish(plan, args, state, started)
    for p in PHASES:
        n = len(plan.runs(p))
        t0 = time.time()
        state[p].update(state="running", started_s=round(t0 - started, 1))
        print(f"---- phase {p} ({n} runs): {state[p]['title']}", flush=True)
        run_phase(plan, p, args.jobs, args.hard_end)
        state[p].update(state="done", seconds=round(time.time() - t0, 1))
        failures = publish(plan, args, state, started)
        print(f"---- phase {p} done in {time.time() - t0:.0f} s; summary.md, results.json and logs.tar.gz "
              f"written ({len(failures)} failure(s) so far)", flush=True)
    shutil.rmtree(plan.ckpt_dir, ignore_errors=True)
    failures, text = check_results.report(json.load(open(os.path.join(args.out, "results.json"))))
    print(text, end="", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
