"""The flight recorder, the watchdog and the hang report, proven on injected faults.

Each case runs a lab with PL_FLIGHT_FAULT=KIND:RANK:STEP (common/flight.h: a test-only
switch that makes one rank do one thing wrong once) and a short --hang-timeout, and checks:
  - the job ends with status 3 within the timeout + 10 s of its start-up,
  - every rank wrote its record (strict JSON) and printed exactly one line on stderr,
  - plots/hang_report.py's first line names the rank the fault was injected on (as the one
    that took another path, has not entered the call, or sent the wrong count), the group,
    the operation and its label, all read from the injected rank's own record.
The report never reads the record's note of the fault ("injected"); this test does.

usage: test_flight.py CASE        one case of CASES (e.g. lab01_skip), or:
       test_flight.py quick       one case per fault kind and per lab (the default suite)
       test_flight.py matrix      every case (ctest label long)
       test_flight.py same_bits   no fault: the losses with the recorder, the watchdog and
                                  --check-collectives are those without, bit for bit
       test_flight.py no_hang     a wrong count without --check-collectives on MPI: no hang, the
                                  run ends with other losses (why the check exists)"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import BUILD, MPIRUN, check, fail, program, run, startup_seconds, strict_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "..", "plots", "hang_report.py")
TIMEOUT = 2  # --hang-timeout: short, the runs are tiny
MODEL = ["--layers", "2", "--d-model", "32", "--heads", "4", "--seq", "16", "--batch", "8", "--steps", "4"]
STEP = 3  # the fault's step (1-based): two steps before it give the report a step to compare with

# lab name -> (program, ranks, flags)
LABS = {
    "lab01": ("lab01_dp", 4, []),
    "lab02": ("lab02_zero", 4, ["--zero-stage", "3"]),
    "lab04_1f1b": ("lab04_1f1b", 4, ["--schedule", "1f1b", "--micro-batches", "4", "--layers", "4"]),
    "lab04_zbv": ("lab04_1f1b", 2, ["--schedule", "zb-v", "--micro-batches", "4", "--layers", "4"]),
    "lab05": ("lab05_tp", 2, []),
    "lab06": ("lab06_3d", 4, ["--tp", "2", "--pp", "2", "--dp", "1"]),
    "lab07": ("lab07_cp", 4, ["--cp", "2", "--cp-algo", "ring"]),
    "lab08": ("lab08_ep", 4, ["--ep", "2"]),
}
# which faults each lab can show: skip needs a collective, peer and tag point-to-point messages,
# order two groups of several ranks, a2a an all-to-all. On MPI a wrong count of a collective
# or an all-to-all does not hang (MPICH completes it with wrong values: test no_hang), so those
# run with --check-collectives, which stops them before the call; a short message is caught
# by the receive's own count check.
FAULTS = {
    "lab01": ["skip", "count", "sleep"],
    "lab02": ["skip", "count", "sleep"],
    "lab04_1f1b": ["skip", "count", "peer", "tag", "sleep"],
    "lab04_zbv": ["skip", "count", "peer", "tag", "sleep"],
    "lab05": ["skip", "count", "sleep"],
    "lab06": ["skip", "count", "peer", "tag", "order", "sleep"],
    "lab07": ["skip", "count", "peer", "tag", "order", "sleep"],
    "lab08": ["skip", "count", "order", "a2a", "sleep"],
}
CHECKED = {("lab01", "count"), ("lab02", "count"), ("lab05", "count"), ("lab06", "count"), ("lab08", "count"),
           ("lab08", "a2a")}
# the injected rank: not rank 0, so a report that always names rank 0 fails
RANK = {"lab04_zbv": 1, "lab05": 1}

CASES = {f"{lab}_{fault}": (lab, fault) for lab, faults in FAULTS.items() for fault in faults}
# the default suite: every fault kind, every lab, two or three minutes on 2 cores
QUICK = ["lab01_skip", "lab02_count", "lab04_1f1b_peer", "lab04_zbv_tag", "lab05_sleep", "lab06_order",
         "lab07_count", "lab08_a2a"]


def run_fault(case, fault_spec=None, extra=()):
    lab, fault = CASES[case]
    prog, n, flags = LABS[lab]
    rank = RANK.get(lab, 2)
    spec = fault_spec or f"{fault}:{rank}:{STEP}"
    out = tempfile.mkdtemp(prefix=f"pl-flight-{case}-")
    args = [*MODEL, *flags, "--hang-timeout", str(TIMEOUT), "--device", "cpu", "--out", out, *extra]
    if (lab, fault) in CHECKED:
        args.append("--check-collectives")
    cmd = [MPIRUN, "-n", str(n), program(prog), *args]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PL_FLIGHT_FAULT=spec)
    start = startup_seconds(prog, n)
    limit = TIMEOUT + 10 + start
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, timeout=limit + 60)
    except subprocess.TimeoutExpired:
        fail(f"{case}: still running {limit + 60:.0f} s after its start: the watchdog did not end the job")
    dt = time.time() - t0
    print(f"$ PL_FLIGHT_FAULT={spec} {' '.join(cmd)}  ->  status {p.returncode} in {dt:.1f} s", flush=True)
    return lab, fault, rank, n, out, p, dt, limit


def check_case(case):
    lab, fault, rank, n, out, p, dt, limit = run_fault(case)
    if p.returncode != 3:
        print(p.stdout[-2000:], p.stderr[-3000:], sep="\n")
        fail(f"{case}: status {p.returncode}, expected 3 (the watchdog's)")
    check(dt <= limit, f"{case}: the job took {dt:.1f} s, more than --hang-timeout {TIMEOUT} + 10 s + start-up "
                       f"{limit - TIMEOUT - 10:.1f} s")
    # one line per rank on stderr, each naming its record
    lines = [l for l in p.stderr.splitlines() if re.match(r"rank \d+: ", l)]
    by_rank = sorted(int(l.split()[1].rstrip(":")) for l in lines)
    check(by_rank == list(range(n)), f"{case}: one stderr line per rank expected, got ranks {by_rank}: {lines}")
    folder = os.path.join(out, "flight")
    records = {}
    for r in range(n):
        path = os.path.join(folder, f"rank-{r}.json")
        check(os.path.exists(path), f"{case}: rank {r} wrote no flight record {path}")
        with open(path, encoding="utf-8") as f:
            records[r] = strict_json(f.read(), path)
        check(records[r]["rank"] == r and records[r]["world_size"] == n, f"{case}: {path} names another rank")
    inj = records[rank].get("injected")
    check(inj and inj["fault"] == fault, f"{case}: rank {rank}'s record does not say the fault fired: {inj}")
    rep = subprocess.run([sys.executable, REPORT, folder], capture_output=True, text=True)
    print(rep.stdout)
    check(rep.returncode == 0, f"{case}: the report found no disagreement (status {rep.returncode})")
    first = rep.stdout.splitlines()[0]
    op = inj["op"]
    named = re.search(r"(?:(\w+) )?group (\{[^}]*\})", inj["text"])
    axis, group = named.group(1), named.group(2)
    # every lab names its groups by the dimension they span (comm_set_axis): "tp group {2,3}"
    check(axis in ("dp", "tp", "pp", "cp", "ep", "edp", "world"), f"{case}: the injected call's group has no axis: "
                                                                  f"{inj['text']!r}")
    check(f"{axis} group {group}" in first, f"{case}: the first line does not name {axis} group {group}")
    # a rank that sleeps is in no operation: the line names the one the others wait in, and says the
    # rank has not entered it (or sent its message)
    if fault != "sleep":
        check(op["kind"] in first, f"{case}: the first line does not name the operation {op['kind']}")
        if op["label"]:
            check(op["label"] in first, f"{case}: the first line does not name the label {op['label']!r}")
    # the injected rank is the one the line blames
    blamed = set()
    for who in re.findall(r"- (ranks? [\d, ]+) (?:took another path|differs?)", first):
        blamed |= {int(x) for x in re.findall(r"\d+", who)}
    blamed |= {int(x) for x in re.findall(r"rank (\d+) has not (?:entered|sent) it", first)}
    blamed |= {int(x) for x in re.findall(r"rank (\d+) sends \d+ values?", first)}
    check(blamed == {rank}, f"{case}: the first line blames {sorted(blamed)}, not the injected rank {rank}")
    print(f"{case}: status 3 in {dt:.1f} s (limit {limit:.1f}), {n} records, the report names rank {rank}, "
          f"{axis} group {group}, {op['kind']} {op['label']!r}")


def losses(lab, extra):
    prog, n, flags = LABS[lab]
    rec, _, _ = run(prog, n, [*MODEL, *flags, *extra])
    return rec["losses"], rec


def same_bits():
    """No fault: the recorder, the watchdog and the check change no bit of the losses."""
    for lab in LABS:
        off, _ = losses(lab, ["--flight-records", "0", "--hang-timeout", "0"])
        on, rec = losses(lab, ["--check-collectives"])
        check(rec["flight"]["records_kept"] == 64 and rec["flight"]["check_collectives"] is True,
              f"{lab}: the record's flight settings: {rec['flight']}")
        check(rec["flight"]["check_calls"] > 0, f"{lab}: --check-collectives made no check: {rec['flight']}")
        check([x.hex() for x in on] == [x.hex() for x in off], f"{lab}: losses differ with the recorder on: "
                                                                 f"{on} vs {off}")
        print(f"{lab}: {len(on)} losses bit-identical with the recorder, watchdog and check on and off; "
              f"{rec['flight']['check_calls']} checks")


def no_hang():
    """A wrong count of an all-reduce on MPI: no hang, no error, wrong values."""
    ref, _ = losses("lab01", [])
    prog, n, flags = LABS["lab01"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PL_FLIGHT_FAULT=f"count:2:{STEP}")
    out = tempfile.mkdtemp(prefix="pl-flight-nohang-")
    p = subprocess.run([MPIRUN, "-n", str(n), program(prog), *MODEL, *flags, "--device", "cpu", "--hang-timeout",
                        str(TIMEOUT), "--out", out], capture_output=True, text=True, env=env, timeout=300)
    check(p.returncode == 0, f"a wrong count without the check: status {p.returncode} (MPICH completes it)")
    with open(os.path.join(out, "records.jsonl"), encoding="utf-8") as f:
        got = json.loads(f.read().splitlines()[-1])["losses"]
    check(got[:STEP] == ref[:STEP] and got[STEP:] != ref[STEP:],
          f"the losses after step {STEP} must differ from the run without the fault: {got} vs {ref}")
    print(f"a wrong count on MPI did not hang: status 0, losses from step {STEP + 1} on differ ({got[-1]} vs "
          f"{ref[-1]}); --check-collectives stops it (lab01_count)")


def main(which):
    if which == "quick":
        for c in QUICK:
            check_case(c)
    elif which == "matrix":
        for c in CASES:
            check_case(c)
    elif which == "same_bits":
        same_bits()
    elif which == "no_hang":
        no_hang()
    elif which in CASES:
        check_case(which)
    else:
        fail(f"unknown case {which}; cases: quick matrix same_bits no_hang {' '.join(CASES)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "quick")
