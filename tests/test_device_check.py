"""The device check can fail, shown without a GPU.

  checker      tests/gpu/check_results.py on fake result sets: a complete, good set
               passes; losses beyond the bound at one middle step (the final losses
               equal), a run skipped for budget, a test that reported "skipped", a
               record on the wrong comm, a non-finite loss, and a comparison with a
               failed run each make it exit 1 and name the cause. And
               device_check.py's runner marks a ctest that printed "***Skipped",
               and a run the deadline left out, as skipped.
  require_gpu  PL_REQUIRE_GPU=1 turns the GPU tests' "no GPU" (exit 77, CTest's
               skip) into a failure: test_gpu_kernels and test_lab01.py cuda, with
               every GPU hidden (CUDA_VISIBLE_DEVICES=""), so it holds on a GPU
               machine too.

usage: test_device_check.py checker|require_gpu"""
import copy
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "gpu"))
from labtest import check  # noqa: E402

CHECKER = os.path.join(HERE, "gpu", "check_results.py")


def record(device, comm, losses):
    return {"lab": "lab01_dp", "device": device, "comm": comm, "losses": list(losses), "tokens_per_s": 1e5,
            "model_flops_per_s": 1e12, "replicas_identical": True, "config": {"layers": 8}}


def lab_run(name, device, comm, losses, **more):
    r = {"name": name, "kind": "lab", "cmd": "mpirun ...", "status": "done", "exit": 0, "expect_exit": 0,
         "seconds": 1.0, "record": record(device, comm, losses),
         "expect": {"device": device, "comm": comm, "steps": len(losses), "config": {"layers": 8}}}
    r.update(more)
    return r


CPU = [5.5, 5.0, 4.6, 4.3, 4.1]
CUDA = [x * (1 + 2e-5) for x in CPU]  # within 1e-3 of the CPU


def good_set():
    return {"runs": [lab_run("lab01 cuda n1", "cuda", "nccl", CUDA),
                     lab_run("lab01 cpu n1", "cpu", "mpi", CPU),
                     {"name": "ctest gpu_lab01_cuda", "kind": "ctest", "cmd": "ctest", "status": "done",
                      "exit": 0, "expect_exit": 0, "seconds": 3.0},
                     dict(lab_run("lab01 cuda n2 comm nccl", "cuda", "mpi", CPU), exit=2, expect_exit=2,
                          record=None, output="error: --comm nccl needs one GPU per rank",
                          expect_output="--comm nccl needs one GPU per rank")],
            "compare": [{"a": "lab01 cuda n1", "b": "lab01 cpu n1", "rtol": 1e-3, "why": "CUDA vs CPU",
                         "a_steps": None, "b_steps": None}],
            "notes": []}


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

    bad = copy.deepcopy(good_set())
    bad["runs"] = []
    must_fail(bad, "nothing ran", "no runs in the result set")

    # the runner: a ctest that printed ***Skipped (and exited 0), and a run past the deadline
    import device_check
    tmp = tempfile.mkdtemp(prefix="pl-runner-")
    plan = type("P", (), {"logs_dir": tmp})()
    lock = threading.Lock()
    skipped = device_check.Run("ctest gpu_fake", "ctest",
                               ["sh", "-c", "echo '1/1 Test #1: gpu_fake .....***Skipped   0.01 sec'"], 1, 30)
    device_check.execute(skipped, plan, time.time() + 60, lock, [])
    late = device_check.Run("lab01 late", "lab", ["true"], 1, 30)
    device_check.execute(late, plan, time.time() - 1, lock, [])
    check(skipped.result["status"] == "skipped", f"a ctest that printed ***Skipped: {skipped.result['status']}")
    check(late.result["status"] == "skipped", f"a run past the deadline: {late.result['status']}")
    must_fail({"runs": [skipped.result, late.result], "compare": []}, "the runner's skips", "not run")


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
    {"checker": checker, "require_gpu": require_gpu}[sys.argv[1]]()
    print("passed")
