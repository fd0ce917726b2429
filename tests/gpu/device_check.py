#!/usr/bin/env python3
"""The runs of the device check (tests/gpu/device-check.sh calls this after the
build): plans every run and comparison, runs them in parallel on the machine's
cores and its one GPU, writes the result set, and returns check_results.py's
verdict on it.

What is planned (STEPS steps each, the labs' default model unless said):
- every test labelled gpu, one ctest each, with PL_REQUIRE_GPU=1 (no GPU = failure);
- compute-sanitizer memcheck, racecheck and synccheck on test_gpu_kernels --small;
- every lab on CUDA and on the CPU at 1 and 2 ranks (lab02: each ZeRO stage; lab04:
  1F1B, and GPipe at 2; lab06: 1x1x1, then pp 2, dp 2, tp 2); each CUDA run's device
  and comm asserted (nccl at 1 rank, mpi at 2 ranks on one GPU); CUDA vs CPU of the
  same run within 1e-3, every CUDA run vs lab01 -n 1 on CUDA within 1e-5;
- --check-sync on lab01 -n 2, lab05 -n 2 and lab06 at dp 2;
- lab01 --bucket-mb (the second stream) at 1 and 2 ranks, --comm mpi at 1 rank,
  --comm nccl at 2 ranks on one GPU (must exit 2), PL_CUDA_SYNC=1;
- a checkpoint saved on CUDA resumed on the CPU, and the reverse;
- gpt2-small (--preset): 3 steps of batch 8 on CUDA for its throughput, and its
  width and length at 2 layers and one sequence on CUDA and on the CPU, compared;
- --precision bf16 (issue 16): gpt2-small's 3 steps on CUDA in bf16 beside fp32's
  (tok/s and model FLOP/s in the summary: MFU = model FLOP/s over the GPU's peak,
  dense bf16 tensor cores for bf16, fp32 for fp32); lab01 in bf16 on CUDA against
  CUDA fp32 and against the CPU's bf16, and lab02 stage 3 and lab05 at 2 ranks in
  bf16 against lab01 -n 1 in bf16 on CUDA.

usage: device_check.py --build DIR --out DIR [--steps N] [--jobs N] [--deadline EPOCH]"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_results  # noqa: E402

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
# The gpu-labelled tests there must be (any others found are run too).
EXPECTED_GPU_TESTS = ["gpu_kernels_vs_cpu"] + [f"gpu_lab0{i}_cuda" for i in range(1, 7)]


class Run:
    def __init__(self, name, kind, argv, cores, timeout, env=None, expect=None, expect_exit=0,
                 expect_output=None, out=None):
        self.name, self.kind, self.argv, self.cores, self.timeout = name, kind, argv, cores, timeout
        self.env, self.expect, self.expect_exit, self.expect_output = env or {}, expect or {}, expect_exit, expect_output
        self.out = out  # the lab's --out folder
        self.result = {"name": name, "kind": kind, "cmd": " ".join(argv), "status": "skipped",
                       "reason": "not started", "expect": self.expect, "expect_exit": expect_exit}
        if expect_output is not None:
            self.result["expect_output"] = expect_output


class Plan:
    def __init__(self, args):
        self.a = args
        self.chains = []   # lists of runs, each list run in order by one worker
        self.compare = []
        self.notes = []
        self.missing = []  # results of planned runs that cannot even start
        self.runs_dir = os.path.join(args.out, "runs")
        self.logs_dir = os.path.join(args.out, "logs")
        self.ckpt_dir = tempfile.mkdtemp(prefix="pl-device-check-")  # big files: not under OUT
        os.makedirs(self.runs_dir, exist_ok=True)
        os.makedirs(self.logs_dir, exist_ok=True)

    def lab(self, name, prog, n, device, args, steps=None, expect=None, env=None, expect_exit=0,
            expect_output=None, timeout=150):
        """A run of ./prog under mpirun -n n on `device`."""
        steps = self.a.steps if steps is None else steps
        out = os.path.join(self.runs_dir, slug(name))
        argv = ["mpirun", "-n", str(n), os.path.join(self.a.build, prog), "--device", device,
                "--steps", str(steps), "--out", out, *args]
        want = {"device": device, "steps": steps}
        if device == "cpu":
            want["comm"] = "mpi"
        else:  # one GPU: NCCL at one rank, ranks sharing the GPU go through MPI
            want["comm"] = "nccl" if n == 1 and "--comm" not in args else "mpi"
        want.update(expect or {})
        return Run(name, "lab", argv, n, timeout, env=env, expect=want, expect_exit=expect_exit,
                   expect_output=expect_output, out=out)

    def add(self, *runs):
        self.chains.append(list(runs))
        return runs[0] if len(runs) == 1 else runs

    def cmp(self, a, b, rtol, why, a_steps=None, b_steps=None):
        self.compare.append({"a": a.name, "b": b.name, "rtol": rtol, "why": why,
                             "a_steps": a_steps, "b_steps": b_steps})


def slug(name):
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)


def gpu_tests(build):
    p = subprocess.run(["ctest", "--test-dir", build, "-N", "-L", "gpu"], capture_output=True, text=True)
    return re.findall(r"Test\s+#\d+:\s*(\S+)", p.stdout)  # "  Test  #8: gpu_kernels_vs_cpu"


def make_plan(args):
    P = Plan(args)
    S = args.steps
    # the longest first: the gpu-labelled tests and the sanitizers
    tests = gpu_tests(args.build)
    for t in EXPECTED_GPU_TESTS:
        if t not in tests:  # planned, and not there: a failure like any skipped run
            P.missing.append({"name": f"ctest {t}", "kind": "ctest", "status": "skipped",
                              "reason": "not listed by ctest -N -L gpu"})
    for t in tests:
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

    # gpt2-small's width and length (C 768, 12 heads of 64, T 1024) on both devices, at
    # 2 layers and one sequence so that the CPU side takes seconds; then the whole
    # preset on CUDA alone, for its throughput
    g2 = ["--preset", "gpt2-small", "--batch", "1", "--layers", "2"]
    g2_shape = {"preset": "gpt2-small", "d_model": 768, "heads": 12, "seq": 1024}
    g2_cpu = P.add(P.lab("gpt2-small L2 b1 cpu", "lab01_dp", 1, "cpu", g2, steps=2,
                         expect={"config": dict(g2_shape, layers=2, batch=1)}, timeout=200))
    g2_cuda = P.add(P.lab("gpt2-small L2 b1 cuda", "lab01_dp", 1, "cuda", g2, steps=2,
                          expect={"config": dict(g2_shape, layers=2, batch=1)}))
    P.cmp(g2_cuda, g2_cpu, CUDA_VS_CPU, "gpt2-small's width and T 1024: CUDA vs CPU")
    P.add(P.lab("gpt2-small cuda", "lab01_dp", 1, "cuda", ["--preset", "gpt2-small"], steps=3,
                expect={"config": dict(g2_shape, layers=12, batch=8)}))
    P.add(P.lab("gpt2-small cuda bf16", "lab01_dp", 1, "cuda", ["--preset", "gpt2-small", "--precision", "bf16"],
                steps=3, expect={"config": dict(g2_shape, layers=12, batch=8, precision="bf16")}))

    # every lab, both devices, 1 and 2 ranks
    ref = P.add(P.lab("lab01 cuda n1", "lab01_dp", 1, "cuda", []))
    cpu_ref = P.add(P.lab("lab01 cpu n1", "lab01_dp", 1, "cpu", []))
    P.cmp(ref, cpu_ref, CUDA_VS_CPU, "CUDA vs CPU")
    variants = [  # (label, program, {n: lab args}, {n: expected record keys})
        ("lab01", "lab01_dp", {2: ["--check-sync"]}, {2: {"replicas_identical": True}}),
        ("lab02 s1", "lab02_zero", {1: ["--zero-stage", "1"], 2: ["--zero-stage", "1"]}, {}),
        ("lab02 s2", "lab02_zero", {1: ["--zero-stage", "2"], 2: ["--zero-stage", "2"]}, {}),
        ("lab02 s3", "lab02_zero", {1: ["--zero-stage", "3"], 2: ["--zero-stage", "3"]}, {}),
        ("lab03", "lab03_pp_naive", {1: [], 2: []}, {}),
        ("lab04 1f1b", "lab04_1f1b", {1: [], 2: []}, {}),
        ("lab04 gpipe", "lab04_1f1b", {2: ["--schedule", "gpipe"]}, {}),
        ("lab05", "lab05_tp", {1: [], 2: ["--check-sync"]}, {2: {"replicated_identical": True}}),
        ("lab06 1x1x1", "lab06_3d", {1: ["--tp", "1", "--pp", "1", "--dp", "1"]}, {}),
        ("lab06 pp2", "lab06_3d", {2: ["--tp", "1", "--pp", "2", "--dp", "1"]}, {}),
        ("lab06 dp2", "lab06_3d", {2: ["--tp", "1", "--pp", "1", "--dp", "2", "--check-sync"]},
         {2: {"replicas_identical": True}}),
        ("lab06 tp2", "lab06_3d", {2: ["--tp", "2", "--pp", "1", "--dp", "1"]}, {}),
    ]
    for label, prog, by_n, expects in variants:
        for n, lab_args in sorted(by_n.items()):  # lab01 -n 1: ref and cpu_ref above
            gpu = P.add(P.lab(f"{label} cuda n{n}", prog, n, "cuda", lab_args, expect=expects.get(n)))
            cpu = P.add(P.lab(f"{label} cpu n{n}", prog, n, "cpu", lab_args, expect=expects.get(n)))
            P.cmp(gpu, cpu, CUDA_VS_CPU, "CUDA vs CPU, same lab and layout")
            P.cmp(gpu, ref, LAYOUT, "every layout reproduces lab01 -n 1 (order of reductions only)")

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

    # checkpoints across devices: 5 steps, save, resume on the other device, 5 steps
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
    return P


def execute(run, plan, deadline, lock, log_lines):
    r = run.result
    if time.time() > deadline:
        r["reason"] = "the time budget was spent before it started"
        return False
    log = os.path.join(plan.logs_dir, slug(run.name) + ".log")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **run.env)
    t0 = time.time()
    r.update(status="error", reason="", log=log)
    try:
        with open(log, "w") as f:
            f.write("$ " + " ".join(f"{k}={v}" for k, v in run.env.items()) + " " + " ".join(run.argv) + "\n")
            f.flush()
            # its own process group, so that a timeout ends mpirun's ranks too
            p = subprocess.Popen(run.argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                r.update(status="done", exit=p.wait(timeout=run.timeout))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                r.update(status="timeout")
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
    if run.out:
        path = os.path.join(run.out, "records.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
            if lines:
                r["record"] = json.loads(lines[-1])
    ok = not check_results.check_run(r)
    with lock:
        line = f"[{time.strftime('%H:%M:%S')}] {'ok    ' if ok else 'FAILED'} {run.name} ({r['seconds']:.1f} s)"
        print(line, flush=True)
        log_lines.append(line)
    return r["status"] == "done" and r.get("exit") == run.expect_exit


def run_all(plan, jobs, deadline):
    """Each chain in one worker, its runs in order; a chain starts when its first
    run's cores are free (jobs cores in all)."""
    lock, free = threading.Lock(), threading.Condition()
    state = {"cores": jobs}
    log_lines, threads = [], []

    def worker(chain, cores):
        try:
            for i, run in enumerate(chain):
                if not execute(run, plan, deadline, lock, log_lines):
                    for later in chain[i + 1:]:  # they need this one (its checkpoint)
                        later.result["reason"] = f"{run.name} before it did not complete"
                    break
        finally:
            with free:
                state["cores"] += cores
                free.notify_all()

    for chain in plan.chains:
        cores = min(max(r.cores for r in chain), jobs)
        with free:
            while state["cores"] < cores:
                free.wait()
            state["cores"] -= cores
        t = threading.Thread(target=worker, args=(chain, cores))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--deadline", type=float, default=time.time() + 400,
                    help="epoch seconds after which no run starts (the rest count as skipped)")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    plan = make_plan(args)
    n = sum(len(c) for c in plan.chains)
    print(f"{n} runs, {len(plan.compare)} comparisons, {args.jobs} cores, "
          f"{max(0, args.deadline - time.time()):.0f} s left to start them", flush=True)
    run_all(plan, args.jobs, args.deadline)
    results = {"runs": plan.missing + [r.result for c in plan.chains for r in c], "compare": plan.compare,
               "notes": plan.notes}
    path = os.path.join(args.out, "results.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    shutil.rmtree(plan.ckpt_dir, ignore_errors=True)
    sys.argv = ["check_results.py", path, "--summary", os.path.join(args.out, "summary.md")]
    return check_results.main()


if __name__ == "__main__":
    sys.exit(main())
