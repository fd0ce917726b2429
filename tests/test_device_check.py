"""The device check can fail, shown without a GPU.

  checker      tests/gpu/check_results.py on fake result sets: a complete, good set
               passes, with gpt2-small's MFU computed from its records (model FLOP/s
               over the H200's dense peak of each precision) beside plan3d's
               prediction; losses beyond the bound at one middle step (the final
               losses equal), a run skipped for budget, a test that reported
               "skipped", a record on the wrong comm, a non-finite loss, a
               comparison with a failed run, a phase-A run missing from the set
               each make it exit 1 and name the cause. And device_check.py's
               runner marks a ctest that printed "***Skipped", and a run the hard
               end left out, as skipped.
  phases       device_check.py on a fake plan (--plan-file) whose phase B hangs:
               phase A's summary.md and results.json are in the results folder
               before the hard end, the whole check ends by the hard end (the
               hanging run cut there, phase C not started), and the folder never
               holds more than 8 files.
  plan         the device check's plan (device_check.py's make_plan, and --list)
               covers every lab directory and every gpu-labelled ctest of the
               build; lab07's algorithms at 1 and 2 ranks on CUDA are compared with
               lab01 -n 1 on CUDA (1e-5) and their CPU twins (1e-3); lab08 runs with
               no --device, must pick the CPU and match lab01 -n 1 --experts 4, and
               --device cuda must be refused; nothing is run.
  require_gpu  PL_REQUIRE_GPU=1 turns the GPU tests' "no GPU" (exit 77, CTest's
               skip) into a failure: test_gpu_kernels and test_lab01.py cuda, with
               every GPU hidden (CUDA_VISIBLE_DEVICES=""), so it holds on a GPU
               machine too.

usage: test_device_check.py checker|phases|plan|require_gpu"""
import copy
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "gpu"))
from labtest import check  # noqa: E402

CHECKER = os.path.join(HERE, "gpu", "check_results.py")


def record(device, comm, losses, flops=1e12, precision="fp32"):
    return {"lab": "lab01_dp", "device": device, "comm": comm, "losses": list(losses), "tokens_per_s": 1e5,
            "model_flops_per_s": flops, "replicas_identical": True,
            "config": {"layers": 8, "precision": precision}}


def lab_run(name, device, comm, losses, **more):
    r = {"name": name, "kind": "lab", "cmd": "mpirun ...", "status": "done", "exit": 0, "expect_exit": 0,
         "seconds": 1.0, "record": record(device, comm, losses),
         "expect": {"device": device, "comm": comm, "steps": len(losses), "config": {"layers": 8}}}
    r.update(more)
    return r


CPU = [5.5, 5.0, 4.6, 4.3, 4.1]
CUDA = [x * (1 + 2e-5) for x in CPU]  # within 1e-3 of the CPU
# gpt2-small's model FLOP/s in the fake records: half the H200's dense peak of each
# precision (989.4 TFLOP/s bf16, 66.9 fp32), so MFU 50.0 %
G2_FLOPS = {"fp32": 0.5 * 66.9e12, "bf16": 0.5 * 989.4e12}


def plan3d_run(precision):
    return {"name": f"plan3d gpt2-small {precision}", "kind": "plan3d", "phase": "A", "cmd": "plan3d ...",
            "status": "done", "exit": 0, "expect_exit": 0, "seconds": 0.1,
            "record": {"tokens_per_s": 2e5, "mfu": 0.54, "precision": precision}}


def good_set():
    runs = [lab_run("lab01 cuda n1", "cuda", "nccl", CUDA),
            lab_run("lab01 cpu n1", "cpu", "mpi", CPU),
            {"name": "ctest gpu_lab01_cuda", "kind": "ctest", "cmd": "ctest", "status": "done",
             "exit": 0, "expect_exit": 0, "seconds": 3.0, "phase": "C"},
            dict(lab_run("lab01 cuda n2 comm nccl", "cuda", "mpi", CPU), exit=2, expect_exit=2, phase="B",
                 record=None, output="error: --comm nccl needs one GPU per rank",
                 expect_output="--comm nccl needs one GPU per rank"),
            {"name": "ctest gpu_kernels_vs_cpu", "kind": "ctest", "cmd": "ctest", "status": "done",
             "exit": 0, "expect_exit": 0, "seconds": 3.0, "phase": "A"}]
    for precision, flops in G2_FLOPS.items():
        g2 = lab_run(f"gpt2-small cuda {precision}", "cuda", "nccl", CUDA, phase="A")
        g2["record"] = record("cuda", "nccl", CUDA, flops, precision)
        runs += [g2, plan3d_run(precision)]
    return {"gpu": "NVIDIA H200", "runs": runs,
            "compare": [{"a": "lab01 cuda n1", "b": "lab01 cpu n1", "rtol": 1e-3, "why": "CUDA vs CPU",
                         "a_steps": None, "b_steps": None}],
            "notes": []}


def gpt2_row(summary, precision):
    """The cells of the summary's gpt2-small row of that precision."""
    for line in summary.splitlines():
        if line.startswith(f"| {precision} |"):
            return [c.strip() for c in line.strip("|").split("|")]
    raise AssertionError(f"no gpt2-small row for {precision} in the summary:\n{summary}")


def verdict(results, case):
    tmp = tempfile.mkdtemp(prefix="pl-verdict-")
    path = os.path.join(tmp, "results.json")
    with open(path, "w") as f:
        json.dump(results, f)
    p = subprocess.run([sys.executable, CHECKER, path, "--summary", os.path.join(tmp, "summary.md")],
                       capture_output=True, text=True, timeout=60)
    failed = [l for l in p.stdout.splitlines() if l.startswith("FAILED")]
    print(f"{case}: exit {p.returncode}; {failed if failed else p.stdout.splitlines()[-1]}")
    check(os.path.exists(os.path.join(tmp, "summary.md")), f"{case}: no summary written")
    return p.returncode, p.stdout


def must_fail(results, case, needle):
    rc, out = verdict(results, case)
    check(rc == 1, f"{case}: the checker must fail (exit 1), got {rc}")
    check(needle in out, f"{case}: the failure must say {needle!r}:\n{out}")


def checker():
    rc, out = verdict(good_set(), "complete and good")
    check(rc == 0 and "all device checks passed" in out, f"a good set must pass:\n{out}")
    check("What one GPU cannot show" in out, "the summary must say what one GPU cannot show")
    # MFU from the records: the columns precision, steps, tok/s, model TFLOP/s, peak, MFU, plan3d tok/s, plan3d MFU
    for precision, peak in (("fp32", "66.9"), ("bf16", "989.4")):
        row = gpt2_row(out, precision)
        print(f"gpt2-small {precision} row: {row}")
        check(row[3] == f"{G2_FLOPS[precision] / 1e12:.1f}" and row[4] == peak and row[5] == "50.0 %",
              f"{precision}: model TFLOP/s, peak {peak} and MFU 50.0 % expected: {row}")
        check(row[6] == "2e+05" and row[7] == "54.0 %" and row[8] == "0.50",
              f"{precision}: plan3d's prediction beside it (tok/s 2e+05, MFU 54 %, measured/predicted 0.50): {row}")
    other = good_set()
    other["gpu"] = "Some GPU 9000"
    rc, out = verdict(other, "a GPU without a known peak")
    check(rc == 0 and gpt2_row(out, "bf16")[5] == "-" and "No peak is known" in out,
          f"an unknown GPU: no MFU, and the summary says why:\n{out}")

    bad = good_set()
    bad["runs"] = [r for r in bad["runs"] if r["name"] != "gpt2-small cuda bf16"]
    must_fail(bad, "a phase-A run missing", "phase A: the run 'gpt2-small cuda bf16' is missing")

    bad = good_set()  # one middle step off by 2e-3 relative; first and last losses equal
    bad["runs"][0]["record"]["losses"] = list(CPU)
    bad["runs"][0]["record"]["losses"][2] *= 1 + 2e-3
    must_fail(bad, "losses beyond the bound mid-run", "losses differ by 2.000e-03")

    bad = good_set()
    bad["runs"][1].update(status="skipped", reason="the time budget was spent before it started")
    bad["runs"][1].pop("record")
    must_fail(bad, "a run skipped for budget", "lab01 cpu n1: not run (the time budget")

    bad = good_set()
    bad["runs"][2].update(status="skipped", reason="ctest reported it skipped / not run")
    must_fail(bad, "a test that reported skipped", "ctest gpu_lab01_cuda: not run")

    bad = good_set()
    bad["runs"][0]["record"]["comm"] = "mpi"
    must_fail(bad, "a CUDA run on the wrong comm", "record comm = 'mpi', expected 'nccl'")

    bad = good_set()
    bad["runs"][0]["record"]["losses"][3] = float("nan")
    must_fail(bad, "a NaN loss", "losses missing or not finite")

    bad = good_set()
    bad["runs"][0].update(exit=1)
    must_fail(bad, "a comparison with a failed run", "did not complete, nothing to compare")

    bad = good_set()
    bad["runs"][3].update(exit=0)
    must_fail(bad, "a bad input that ran", "exit status 0, expected 2")

    bad = good_set()  # every rank printed the refusal: bad input is one line
    bad["runs"][3]["output"] += "\nerror: --comm nccl needs one GPU per rank"
    must_fail(bad, "a refusal printed by every rank", "refused in 2 'error:' lines, expected one")

    bad = copy.deepcopy(good_set())
    bad["runs"] = []
    must_fail(bad, "nothing ran", "no runs in the result set")

    # the runner: a ctest that printed ***Skipped (and exited 0), and a run past the hard end
    import device_check
    tmp = tempfile.mkdtemp(prefix="pl-runner-")
    plan = type("P", (), {"logs_dir": tmp, "a": type("A", (), {"work": tmp})})()
    lock = threading.Lock()
    skipped = device_check.Run("ctest gpu_fake", "ctest",
                               ["sh", "-c", "echo '1/1 Test #1: gpu_fake .....***Skipped   0.01 sec'"], 1, 30)
    device_check.execute(skipped, plan, time.time() + 60, lock, [])
    late = device_check.Run("lab01 late", "lab", ["true"], 1, 30)
    device_check.execute(late, plan, time.time() - 1, lock, [])
    check(skipped.result["status"] == "skipped", f"a ctest that printed ***Skipped: {skipped.result['status']}")
    check(late.result["status"] == "skipped", f"a run past the hard end: {late.result['status']}")
    must_fail({"runs": [skipped.result, late.result], "compare": []}, "the runner's skips", "not run")


def fake_lab():
    """A stand-in for a lab in the phases test: OUT/records.jsonl with a record."""
    out, device, comm, precision, flops = sys.argv[2:7]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "records.jsonl"), "w") as f:
        f.write(json.dumps(record(device, comm, CUDA if device == "cuda" else CPU, float(flops), precision)) + "\n")


def fake_plan3d():
    """A stand-in for plan3d --json FILE in the phases test."""
    path, precision = sys.argv[2:4]
    with open(path, "w") as f:
        json.dump({"model": {"params": 86235648}, "cluster": {"name": "h200", "efficiency": 0.57},
                   "training": {"precision": precision},
                   "layouts": [{"winner": True, "label": "tp=1 pp=1 dp=1", "tokens_per_s": 2e5, "mfu": 0.54,
                                "step_s": 0.04, "mem_total_bytes": 6e9}]}, f)


def phases():
    """A fake plan whose phase B hangs: phase A's verdict comes back before the hard end."""
    tmp = tempfile.mkdtemp(prefix="pl-phases-")
    out, work = os.path.join(tmp, "out"), os.path.join(tmp, "work")
    me = [sys.executable, os.path.abspath(__file__)]

    def lab(name, device, comm, precision="fp32", flops=1e12, alone=False):
        d = os.path.join(work, "runs", name.replace(" ", "_"))
        return {"name": name, "argv": me + ["fake_lab", d, device, comm, precision, str(flops)], "out": d,
                "alone": alone, "expect": {"device": device, "comm": comm, "steps": len(CPU)}}

    def plan3d(precision):
        path = os.path.join(tmp, f"plan3d-{precision}.json")
        return {"name": f"plan3d gpt2-small {precision}", "kind": "plan3d", "out": path,
                "argv": me + ["fake_plan3d", path, precision]}

    plan = {"phases": {
        "A": [lab(f"gpt2-small cuda {p}", "cuda", "nccl", p, G2_FLOPS[p], alone=True) for p in G2_FLOPS]
             + [{"name": "ctest gpu_kernels_vs_cpu", "kind": "ctest", "argv": ["true"]},
                lab("lab01 cuda n1", "cuda", "nccl"), lab("lab01 cpu n1", "cpu", "mpi"),
                plan3d("fp32"), plan3d("bf16")],
        "B": [lab("lab02 s3 cpu n2", "cpu", "mpi"),
              {"name": "lab01 cuda n2 hangs", "argv": ["sleep", "600"], "timeout": 300}],
        "C": [{"name": "ctest gpu_lab01_cuda", "kind": "ctest", "argv": ["true"]}]},
        "compare": [{"a": "lab01 cuda n1", "b": "lab01 cpu n1", "rtol": 1e-3, "why": "CUDA vs CPU"}]}
    plan_file = os.path.join(tmp, "plan.json")
    with open(plan_file, "w") as f:
        json.dump(plan, f)
    hard_end = 20  # seconds; phase A takes about 1 s
    start = time.time()
    with open(os.path.join(tmp, "device_check.log"), "w") as log:
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "gpu", "device_check.py"), "--build", tmp,
                              "--out", out, "--work", work, "--plan-file", plan_file, "--jobs", "2",
                              "--hard-end", str(start + hard_end), "--gpu", "NVIDIA H200"],
                             stdout=log, stderr=subprocess.STDOUT)
        summary, seen_a, most = os.path.join(out, "summary.md"), None, 0
        while p.poll() is None:
            if time.time() - start > hard_end + 30:
                p.kill()
                check(False, "device_check.py still running 30 s after the hard end")
            if os.path.isdir(out):
                most = max(most, sum(len(files) for _, _, files in os.walk(out)))
            if seen_a is None and os.path.exists(summary):
                with open(summary) as f:
                    if "phase A: passed" in f.read():
                        seen_a = time.time() - start
            time.sleep(0.2)
    took = time.time() - start
    with open(summary) as f:
        text = f.read()
    with open(os.path.join(out, "results.json")) as f:
        results = {r["name"]: r for r in json.load(f)["runs"]}
    files = sorted(os.listdir(out))
    print(f"phase A's verdict in the results folder after {seen_a} s; the check ended after {took:.1f} s "
          f"(hard end {hard_end} s), exit {p.returncode}; at most {most} files there, at the end: {files}")
    check(seen_a is not None and seen_a < hard_end, f"phase A's summary must be there before the hard end: {seen_a}")
    check(took < hard_end + 10, f"the check must end by the hard end (+10 s to write): {took:.1f} s")
    check(p.returncode == 1, f"a phase that hung is a failed check: exit {p.returncode}")
    check(most <= 8 and len(files) <= 8, f"at most 8 files come back: {most} seen, {files}")
    check(set(files) == {"summary.md", "results.json", "logs.tar.gz"}, f"the results folder: {files}")
    for name in plan["phases"]["A"]:
        r = results[name["name"]]
        check(r["status"] == "done" and r.get("exit") == 0, f"phase A's {name['name']}: {r['status']}")
    hung = results["lab01 cuda n2 hangs"]
    check(hung["status"] == "timeout" and "cut at the hard end" in hung["reason"],
          f"the hanging run must be cut at the hard end: {hung['status']} {hung.get('reason')}")
    check(results["ctest gpu_lab01_cuda"]["reason"] == "the hard end came before it started",
          f"phase C must not start after the hard end: {results['ctest gpu_lab01_cuda']}")
    check("- phase A: passed" in text and "- phase B: FAILED" in text and gpt2_row(text, "bf16")[5] == "50.0 %",
          f"the final summary: phase A passed with its MFU, phase B failed:\n{text}")
    with tarfile.open(os.path.join(out, "logs.tar.gz")) as tar:
        names = tar.getnames()
    check("device-check/logs/lab01_cuda_n1.log" in names and "device-check/logs/lab01_cuda_n2_hangs.log" in names,
          f"logs.tar.gz holds every run's log: {names}")


def plan():
    import device_check
    build = os.environ["BUILD_DIR"]
    tmp = tempfile.mkdtemp(prefix="pl-plan-")
    args = type("A", (), dict(build=build, out=tmp, work=tmp, steps=10, jobs=16, gpu="NVIDIA H200", rehearse=False))()
    P = device_check.make_plan(args)
    runs = {r.name: r for r in P.runs()}
    compared = {(c["a"], c["b"]): c["rtol"] for c in P.compare}
    progs = {os.path.basename(a) for r in runs.values() for a in r.argv[:4]}
    labs = sorted(d for d in os.listdir(os.path.join(HERE, "..")) if d[:3] == "lab" and d[3:5].isdigit()
                  and d != "lab00_concepts" and os.path.exists(os.path.join(HERE, "..", d, "main.c")))
    print(f"{len(runs)} runs, {len(P.compare)} comparisons; labs {labs}")
    check(set(labs) <= progs, f"labs without a run in the device check: {sorted(set(labs) - progs)}")
    check(set(labs) <= set(device_check.TARGETS), f"labs without a build target: {sorted(set(labs) - set(device_check.TARGETS))}")
    check(not P.missing, f"gpu-labelled ctests the plan expects and the build lacks: {[m['name'] for m in P.missing]}")
    listed = [f"ctest {t}" for t in device_check.gpu_tests(build)]
    check(listed and all(t in runs for t in listed), f"gpu ctests {listed} not all in the plan")
    for n in (1, 2):
        for algo in ("ring", "allgather", "ulysses"):
            gpu, cpu = f"lab07 {algo} cuda n{n}", f"lab07 {algo} cpu n{n}"
            check(gpu in runs and runs[gpu].argv[:3] == ["mpirun", "-n", str(n)]
                  and ["--cp-algo", algo] == runs[gpu].argv[-2:] and runs[gpu].expect["device"] == "cuda",
                  f"{gpu}: {runs.get(gpu) and runs[gpu].argv}")
            check(compared.get((gpu, "lab01 cuda n1")) == device_check.LAYOUT
                  and compared.get((gpu, cpu)) == device_check.CUDA_VS_CPU
                  and compared.get((cpu, "lab01 cpu n1")) == device_check.LAYOUT,
                  f"{gpu}: not compared with lab01 cuda n1 at 1e-5 and its CPU twin at 1e-3")
    check(("lab07 ring cuda n2 bf16", "lab01 cuda n1 bf16") in compared, "lab07's bf16 not compared with lab01's")
    auto = runs.get("lab08 auto n2")
    check(auto is not None and "--device" not in auto.argv and auto.expect["device"] == "cpu"
          and compared.get(("lab08 auto n2", "lab01 cpu n1 experts 4")) == device_check.LAYOUT
          and runs["lab01 cpu n1 experts 4"].argv[-2:] == ["--experts", "4"],
          "lab08 with no --device must pick the CPU and match lab01 -n 1 --experts 4 at 1e-5")
    refused = runs.get("lab08 cuda n2")
    check(refused is not None and refused.expect_exit == 2 and ["--device", "cuda"] == refused.argv[4:6]
          and refused.expect_output == device_check.EXPERTS_CUDA_REFUSAL, "lab08 --device cuda must be refused")
    p = subprocess.run([sys.executable, os.path.join(HERE, "gpu", "device_check.py"), "--build", build, "--out", tmp,
                        "--list"], capture_output=True, text=True, timeout=60)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    check(p.returncode == 0 and last == f"{len(runs)} runs, {len(P.compare)} comparisons"
          and "lab08 auto n2 vs lab01 cpu n1 experts 4 <= 1e-05" in p.stdout,
          f"--list: exit {p.returncode}, last line {last!r}")
    check(not os.path.exists(os.path.join(tmp, "results.json")), "--list must run nothing")


def require_gpu():
    kernels = os.environ["GPU_KERNELS_TEST"]
    lab01 = os.path.join(HERE, "test_lab01.py")
    hidden = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    for name, cmd in (("test_gpu_kernels", [kernels]), ("test_lab01.py cuda", [sys.executable, lab01, "cuda"])):
        plain = subprocess.run(cmd, capture_output=True, text=True, env=hidden, timeout=120)
        strict = subprocess.run(cmd, capture_output=True, text=True, env=dict(hidden, PL_REQUIRE_GPU="1"),
                                timeout=120)
        print(f"{name} without a GPU: exit {plain.returncode}; with PL_REQUIRE_GPU=1: exit {strict.returncode}")
        check(plain.returncode == 77, f"{name}: no GPU must be a skip (77), got {plain.returncode}")
        check(strict.returncode not in (0, 77), f"{name}: PL_REQUIRE_GPU=1 must make it fail, got {strict.returncode}")


if __name__ == "__main__":
    {"checker": checker, "phases": phases, "plan": plan, "require_gpu": require_gpu, "fake_lab": fake_lab,
     "fake_plan3d": fake_plan3d}[sys.argv[1]]()
    print("passed")
