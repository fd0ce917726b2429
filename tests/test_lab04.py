"""lab04_1f1b against its promises: every stage count, micro-batch count and
schedule reproduces lab01's one-rank losses; each rank runs its forwards and
backwards in the textbook order of its schedule (read from the timeline it
wrote, not from its own plan); each stage's activation peak, measured by the
allocator, is the schedule's formula; bad input fails fast and clearly.

usage: test_lab04.py equivalence|order|cuda"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import check, compare_losses, run, skip_without_gpu  # noqa: E402
from test_lab03 import BASE, check_pipeline_record, read_timeline  # noqa: E402  (the same model as lab03's tests)

LAB = "lab04_1f1b"


def in_flight(schedule, p, m):
    """Micro-batches of activations a stage holds at its peak."""
    return [m if schedule == "gpipe" else min(m, p - r) for r in range(p)]


def check_lab04_record(rec, n, m, schedule):
    check(rec["micro_batches"] == m and rec["schedule"] == schedule, f"record says {rec['micro_batches']} {rec['schedule']}")
    theory = (n - 1) / (m + n - 1)
    check(abs(rec["bubble"]["theory"] - theory) < 1e-5, f"theory {rec['bubble']['theory']} != (p-1)/(m+p-1) = {theory}")
    # the same bytes as lab03, in m messages per boundary and direction
    boundaries = 0 if n == 1 else 1 if n == 2 else 2
    if boundaries:
        check(rec["comm_calls_per_step"]["send"] == boundaries * m,
              f"sends per step {rec['comm_calls_per_step']['send']} != {boundaries} x m")
    check_pipeline_record(rec, n, in_flight(schedule, n, m))


def equivalence():
    ref, _, _ = run("lab01_dp", 1, BASE)
    layouts = [(n, m) for n in (2, 4) for m in (1, 2, 4, 8)] + [(3, 4)]  # 3 stages: an uneven split
    for n, m in layouts:
        for schedule in ("gpipe", "1f1b"):
            rec, _, _ = run(LAB, n, BASE + ["--micro-batches", str(m), "--schedule", schedule])
            compare_losses(f"lab04 -n {n} m={m} {schedule} vs lab01 -n 1", rec["losses"], ref["losses"], 1e-5)
            check_lab04_record(rec, n, m, schedule)


# The textbook tables for p = 4 stages, m = 8 micro-batches, one row per stage
# (GPipe: Huang et al. 2019; 1F1B: Narayanan et al. 2021, figure 4 top, here
# counted from 0). F3 is the forward of micro-batch 3, B3 its backward.
TEXTBOOK = {
    "gpipe": ["F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7"] * 4,
    "1f1b": [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    ],
}


def order():
    p, m = 4, 8
    for schedule, table in TEXTBOOK.items():
        rec, _, _ = run(LAB, p, BASE[:1] + ["3"] + BASE[2:] + ["--micro-batches", str(m), "--schedule", schedule])
        ranks = read_timeline(rec, 1)  # step 0 is warm-up
        check(sorted(ranks) == list(range(p)), f"{schedule}: the timeline must hold every rank")
        work = {}  # (rank, "F"/"B", micro-batch) -> (start, end)
        for r in range(p):
            ops = [e for e in ranks[r] if e[2] in ("forward", "backward")]
            seen = " ".join(("F" if e[2] == "forward" else "B") + str(e[4]) for e in ops)
            check(seen == table[r], f"{schedule} rank {r}:\n  timeline {seen}\n  textbook {table[r]}")
            for e in ops:
                work[(r, "F" if e[2] == "forward" else "B", e[4])] = (e[0], e[1])
            # every micro-batch crosses each of this rank's boundaries once each way, in order
            for op, has_peer in (("recv_act", r > 0), ("send_act", r < p - 1),
                                 ("recv_grad", r < p - 1), ("send_grad", r > 0)):
                mbs = [e[4] for e in ranks[r] if e[2] == op]
                check(mbs == (list(range(m)) if has_peer else []), f"{schedule} rank {r}: {op} micro-batches {mbs}")
        # the dependencies, from the clock: a stage's forward of i needs the
        # previous stage's forward of i; its backward of i the next stage's backward of i
        for i in range(m):
            for r in range(1, p):
                check(work[(r, "F", i)][0] >= work[(r - 1, "F", i)][1], f"{schedule}: F{i} on {r} before it left {r - 1}")
                check(work[(r - 1, "B", i)][0] >= work[(r, "B", i)][1], f"{schedule}: B{i} on {r - 1} before it left {r}")
        print(f"{schedule} p={p} m={m}: every rank's order is the textbook's, and the clock respects the dependencies")
        for r in range(p):
            print(f"  rank {r}: {table[r]}")
        check_lab04_record(rec, p, m, schedule)


def cuda():
    """GPU-labelled: both schedules on CUDA reproduce lab01 on the CPU, with the
    same activation peaks; skipped (77) without a GPU."""
    skip_without_gpu(LAB)
    cpu, _, _ = run("lab01_dp", 1, BASE + ["--device", "cpu"])
    for n in (2, 4):
        for schedule in ("gpipe", "1f1b"):
            gpu, _, _ = run(LAB, n, BASE + ["--device", "cuda", "--micro-batches", "4", "--schedule", schedule])
            compare_losses(f"lab04 cuda -n {n} {schedule} vs lab01 cpu -n 1", gpu["losses"], cpu["losses"], 1e-3)
            check_lab04_record(gpu, n, 4, schedule)


if __name__ == "__main__":
    {"equivalence": equivalence, "order": order, "cuda": cuda}[sys.argv[1]]()
    print("passed")
