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


def program(name):
    return os.path.join(BUILD, name)


def run(lab, n, args, timeout=600, check=True):
    """Run `mpirun -n n ./lab args --out TMP` and return (record, completed process)."""
    out = tempfile.mkdtemp(prefix="pl-test-")
    cmd = [MPIRUN, "-n", str(n), program(lab), *args, "--out", out]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    elapsed = time.time() - t0
    print(f"$ {' '.join(cmd)}  ->  status {p.returncode} in {elapsed:.1f} s", flush=True)
    if check and p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
        fail(f"{lab} -n {n} exited with {p.returncode}")
    rec = None
    path = os.path.join(out, "records.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            lines = f.read().splitlines()
        if lines:
            rec = json.loads(lines[-1])
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
