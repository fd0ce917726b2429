"""lab03_pp_naive against its promises: any stage count reproduces lab01's
one-rank losses, the layers split as documented (the last L mod p stages get one
more), only one stage works at a time (the timeline is a staircase), each stage
holds one batch of activations, the traffic is one activation and one gradient
per boundary, and bad input fails fast and clearly.

--experts: the stages reproduce lab01's one-rank MoE run (loss, aux loss,
dropped choices and loads), top-1 and top-2, with and without a capacity.

usage: test_lab03.py equivalence|timeline|experts|cuda"""
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import check, compare_losses, compare_runs, run, skip_without_gpu  # noqa: E402

LAB = "lab03_pp_naive"
# a small model keeps the suite fast; lab01 and lab03 get exactly the same flags
L, C, T, B = 4, 64, 64, 16
BASE = ["--steps", "20", "--layers", str(L), "--d-model", str(C), "--seq", str(T), "--batch", str(B)]


def documented_split(layers, stages):
    """stage.h: q = L // p layers each, the last L % p stages one more."""
    q, extra = divmod(layers, stages)
    sizes = [q + (1 if r >= stages - extra else 0) for r in range(stages)]
    starts = [sum(sizes[:r]) for r in range(stages)]
    return [[s, s + n] for s, n in zip(starts, sizes)]


def check_pipeline_record(rec, n, in_flight):
    """What every pipeline record must say, whatever the schedule."""
    check(rec["stage_layers"] == documented_split(L, n),
          f"-n {n}: stage layers {rec['stage_layers']} != documented split {documented_split(L, n)}")
    check(len(rec["bubble"]["measured"]) == n and all(0 <= b <= 1 for b in rec["bubble"]["measured"]),
          f"-n {n}: the record must carry a measured bubble per rank: {rec['bubble']}")
    # activations: measured by the allocator == the schedule's count x one micro-batch's bytes
    per_mb, formula = rec["acts_bytes_per_micro_batch"], rec["acts_peak_bytes_formula_per_rank"]
    measured = rec["mem_peak_bytes_per_rank"]["acts"]
    check(rec["acts_in_flight_formula"] == in_flight,
          f"-n {n}: activations in flight {rec['acts_in_flight_formula']} != {in_flight}")
    check(formula == [k * b for k, b in zip(in_flight, per_mb)], f"-n {n}: formula bytes {formula}")
    check(measured == formula, f"-n {n}: measured activation peaks {measured} != formula {formula}")
    check(rec["acts_peak_measured_bytes"] == measured, "the two records of the peak disagree")
    # every parameter lives on exactly one stage
    check(sum(rec["mem_peak_bytes_per_rank"]["params"]) == 4 * rec["params"],
          f"-n {n}: the stages' parameters do not add up to the model")
    # traffic: per boundary one activation forward and one gradient back, B x T x C floats each
    boundaries = 0 if n == 1 else 1 if n == 2 else 2
    check(rec["comm_ring_bytes_per_step"] == rec["comm_formula_bytes_per_step"] == boundaries * 2 * B * T * C * 4,
          f"-n {n}: traffic {rec['comm_ring_bytes_per_step']} != formula {rec['comm_formula_bytes_per_step']}")
    print(f"-n {n}: layers {rec['stage_layers']}, activation peaks {measured} = formula, "
          f"bubble measured {rec['bubble']['measured']} (theory {rec['bubble']['theory']:.3f})")


def equivalence():
    ref, _, _ = run("lab01_dp", 1, BASE)
    for n in (2, 3, 4):  # 3 splits 4 layers unevenly: [0,1) [1,2) [2,4)
        rec, _, _ = run(LAB, n, BASE)
        compare_runs(f"lab03 -n {n} vs lab01 -n 1", rec, ref, 1e-5)
        check(abs(rec["bubble"]["theory"] - (n - 1) / n) < 1e-5, f"-n {n}: theory must be (p-1)/p")
        check_pipeline_record(rec, n, [1] * n)


def read_timeline(rec, step):
    """Per rank, the compute events ("forward"/"backward") of one step, in time order."""
    rows = [r for r in csv.DictReader(open(rec["timeline"])) if int(r["step"]) == step]
    per_rank = {}
    for r in rows:
        per_rank.setdefault(int(r["rank"]), []).append(
            (float(r["start_us"]), float(r["end_us"]), r["op"], r["kind"], int(r["micro_batch"])))
    for events in per_rank.values():
        events.sort()
    return per_rank


def timeline():
    n = 4
    rec, _, _ = run(LAB, n, BASE[:1] + ["3"] + BASE[2:])
    ranks = read_timeline(rec, 1)  # step 0 is warm-up
    check(sorted(ranks) == list(range(n)), f"the timeline must hold every rank: {sorted(ranks)}")
    work = {r: [e for e in ev if e[2] in ("forward", "backward")] for r, ev in ranks.items()}
    for r in range(n):
        check([e[2] for e in work[r]] == ["forward", "backward"], f"rank {r}: {work[r]}")
        comm = [(e[2], e[4]) for e in ranks[r] if e[3] == "comm" and e[4] >= 0]
        want = ([("recv_act", 0)] if r > 0 else []) + ([("send_act", 0)] if r < n - 1 else []) + \
               ([("recv_grad", 0)] if r < n - 1 else []) + ([("send_grad", 0)] if r > 0 else [])
        check(comm == want, f"rank {r}: exchanges {comm} != {want}")
    # the staircase: forward 0 -> 1 -> 2 -> 3, then backward 3 -> 2 -> 1 -> 0,
    # each starting after the previous one ended: one stage works at a time
    order = [work[r][0] for r in range(n)] + [work[r][1] for r in reversed(range(n))]
    for a, b in zip(order, order[1:]):
        check(b[0] >= a[1], f"{b[2]} starts at {b[0]:.0f} us before the previous stage's {a[2]} ended ({a[1]:.0f} us)")
    print("timeline -n 4: forward on stages 0,1,2,3 then backward on 3,2,1,0, never two at once")


def cuda():
    """GPU-labelled: lab03 on CUDA reproduces lab01 on the CPU; skipped (77) without a GPU."""
    skip_without_gpu(LAB)
    cpu, _, _ = run("lab01_dp", 1, BASE + ["--device", "cpu"])
    for n in (2, 4):
        gpu, _, _ = run(LAB, n, BASE + ["--device", "cuda"])
        # cuBLAS sums in another order than OpenBLAS: bound 1e-3 over 20 steps, as lab01's
        compare_runs(f"lab03 cuda -n {n} vs lab01 cpu -n 1", gpu, cpu, 1e-3)
        check_pipeline_record(gpu, n, [1] * n)


# --experts: capacity is per sequence and the aux loss a mean over sequences, so
# neither depends on how the batch is cut into micro-batches; each stage's layers
# add their aux loss to the loss and to the reported aux loss (an all-reduce)
MOE = ["--steps", "10", "--layers", "4", "--d-model", "32", "--heads", "4", "--seq", "16", "--batch", "8",
       "--experts", "4"]
MOE_ROUTINGS = [["--top-k", k, "--capacity-factor", f] for k in ("2", "1") for f in ("0", "1")]


def check_experts_match(rec, ref, what):
    """rec (a pipeline's record) reproduces lab01 -n 1's ref within 1e-5, drops and loads exactly."""
    compare_runs(f"{what}: loss", rec, ref, 1e-5)
    compare_losses(f"{what}: aux loss", rec["aux_losses"], ref["aux_losses"], 1e-5)
    check(rec["dropped_per_step"] == ref["dropped_per_step"], f"{what}: dropped choices differ from lab01's")
    check(rec["expert_choices_last_step"] == ref["expert_choices_last_step"], f"{what}: the loads differ from lab01's")


def experts():
    for routing in MOE_ROUTINGS:
        ref, _, _ = run("lab01_dp", 1, MOE + routing)
        check(min(ref["dropped_per_step"]) > 0 or routing[-1] == "0", "the capacity drops nothing: a weak case")
        rec, _, _ = run(LAB, 2, MOE + routing)
        check_experts_match(rec, ref, f"lab03 -n 2 {' '.join(routing)}")
        print(f"lab03 -n 2 --experts 4 {' '.join(routing)}: loss {rec['losses'][-1]:.6f}, aux "
              f"{rec['aux_losses'][-1]:.6f}, dropped {rec['dropped_per_step'][-1]:.0f} = lab01 -n 1's")


if __name__ == "__main__":
    {"equivalence": equivalence, "timeline": timeline, "experts": experts,
     "cuda": cuda}[sys.argv[1]]()
    print("passed")
