"""--precision bf16 in every lab: equivalence, memory, checkpoints across precision.

  equivalence  20 steps of a small model in bf16: lab01 -n 1 twice, bit for bit;
               lab01 -n 2 with buckets, lab02 each stage at -n 2, lab04 (1f1b,
               m = 4) at -n 2, lab05 at -n 2, lab06 2 x 2 x 1 and lab06 1 x 2 x 2
               --zero-stage 1 (the master weights sharded too) against it within
               BOUND; bf16 against fp32 within 2 % at every step, 1 % at the end;
               every record's memory per category and traffic exactly theory/'s
               bf16 formulas (plan3d --check, the same functions the labs print
               beside their figures), and the model states 2 + 2 + 12 bytes per
               parameter held.
  resume       10 steps bf16, save; resumed in fp32 (lab01 and lab02 ZeRO-3 -n 2)
               and 10 more; an fp32 checkpoint resumed in bf16 (lab05 -n 2, lab04
               -n 2, lab02 ZeRO-1, lab06 1x2x2 ZeRO-1): the state read is the state written (resumed with --lr 0 and no
               weight decay for one step and saved again, the weights come back bit
               for bit: a bf16 run's fp32 master copy is what the file holds).
  kernel_times PL_KERNEL_TIMES=1 (common/kernel_times.h), lab01 -n 1 in fp32 and in
               bf16: the same losses bit for bit as without it (off by default: no
               kernel_ms_per_step in a plain record); every kernel kind a step runs
               has time; the kinds and the rest add up to the mean measured step.

BOUND, bf16 layouts against bf16 lab01 -n 1: every layout adds the same
products, in another order of rounding. lab01 -n 1 rounds each weight gradient
to bf16 once (an fp32 sum over the whole batch); N data-parallel ranks round
their partial gradients, then sum N bf16 values pairwise in fp32 with a
rounding after each (comm.c), the pipeline rounds each micro-batch's
contribution as it accumulates, and TP rounds each rank's partial output
before the all-reduce: each a relative error of at most 2^-8 per rounding on
a gradient or activation element, of random sign. AdamW divides the moment
by its root mean square, so the step of a weight moves by about as much,
relatively; the loss, an average over 128 positions and 100k weights, moves
far less. Measured over 20 steps of this model, the layouts above and lab03,
lab04 zb-h1, lab06 2x2x2 at seeds 1, 2, 3: at most 4.5e-5, 4.4e-5, 7.6e-5
relative, 0 for lab03 (a stage boundary changes no sum). BOUND = 5e-4, over
six times the worst: a mistake (a gradient summed twice, a shard
missed, a master copy not updated) moves the loss by percents within a few
steps. fp32 against lab01 -n 1 stays at the course's 1e-5 (the other tests)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import BF16_GRAD_NORM_RTOL, BUILD, check, compare_runs, fail, max_rel_diff, run  # noqa: E402

MODEL = ["--layers", "4", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "8", "--clip", "1"]
BF16 = ["--precision", "bf16"]
BOUND = 5e-4
LAYOUTS = [
    ("lab01_dp", 2, ["--bucket-mb", "0.02"]),
    ("lab02_zero", 2, ["--zero-stage", "1"]),
    ("lab02_zero", 2, ["--zero-stage", "2"]),
    ("lab02_zero", 2, ["--zero-stage", "3"]),
    ("lab04_1f1b", 2, ["--micro-batches", "4", "--schedule", "1f1b"]),
    ("lab05_tp", 2, []),
    ("lab06_3d", 4, ["--tp", "2", "--pp", "2", "--micro-batches", "2"]),
    ("lab06_3d", 4, ["--tp", "1", "--pp", "2", "--dp", "2", "--micro-batches", "2", "--zero-stage", "1"]),
]


def plan3d_check(folder):
    """plan3d --check: every record's memory and traffic against theory/'s formulas."""
    p = subprocess.run([os.path.join(BUILD, "plan3d"), "--check", folder], capture_output=True, text=True)
    print(p.stdout[-3000:], p.stderr[-1000:])
    check(p.returncode == 0, f"plan3d --check {folder}: exit {p.returncode} (a record differs from the formulas)")


def model_states(rec):
    s = rec["model_state_bytes_per_param"]
    got = (s["params"], s["grads"], s["optim"])
    check(s["formula"] == [2, 2, 12] and got == (2.0, 2.0, 12.0),
          f"{rec['lab']}: model states {got} per parameter held, formula {s['formula']}: want 2 + 2 + 12")


def equivalence():
    out = tempfile.mkdtemp(prefix="pl-bf16-")
    steps = ["--steps", "20"]
    ref, _, _ = run("lab01_dp", 1, MODEL + steps + BF16, out=out)
    again, _, _ = run("lab01_dp", 1, MODEL + steps + BF16, out=tempfile.mkdtemp(prefix="pl-bf16-"))
    check(again["losses"] == ref["losses"], "bf16: the same command twice must give the same bits")
    check(ref["config"]["precision"] == "bf16", "the record must say the precision")
    model_states(ref)
    fp32, _, _ = run("lab01_dp", 1, MODEL + steps, out=tempfile.mkdtemp(prefix="pl-fp32-"))
    check(fp32["config"]["precision"] == "fp32", "fp32 is the default")
    d = max_rel_diff(ref["losses"], fp32["losses"])
    final = abs(ref["losses"][-1] - fp32["losses"][-1]) / fp32["losses"][-1]
    print(f"bf16 vs fp32: max relative loss difference {d:.2e} (bound 2e-2), final {final:.2e} (bound 1e-2)")
    check(d <= 2e-2 and final <= 1e-2, "bf16 must follow fp32's loss curve within 2 % (1 % at the end)")
    check(ref["losses"][-1] < ref["losses"][0] - 0.3, "bf16 must train")
    for lab, n, flags in LAYOUTS:
        rec, _, _ = run(lab, n, MODEL + steps + BF16 + flags, out=out)
        compare_runs(f"bf16 {lab} -n {n} {' '.join(flags)} vs bf16 lab01 -n 1", rec, ref, BOUND,
                     grad_rtol=BF16_GRAD_NORM_RTOL)
        if "--zero-stage" not in flags:  # ZeRO's states per parameter: lab02's and lab06's own lines, tested there
            model_states(rec)
    # lab09's experts under ZeRO-1 (the fp32 master and moments in slices over the replicas and EDP): in bf16 a
    # near-tied token may route elsewhere once the layouts' bits differ, so the first step is compared (before
    # any flip), and plan3d --check holds its memory and traffic to the formulas like the others'
    experts = ["--experts", "4", "--capacity-factor", "1.0"]
    ref_moe, _, _ = run("lab01_dp", 1, MODEL + steps + BF16 + experts, out=tempfile.mkdtemp(prefix="pl-bf16-"))
    for layout in (["--tp", "1", "--cp", "2", "--pp", "2", "--dp", "2", "--ep", "2"],
                   ["--tp", "2", "--cp", "2", "--pp", "1", "--dp", "2", "--ep", "2"]):  # beside TP: three kinds
        rec, _, _ = run("lab09_5d", 8, MODEL + steps + BF16 + experts + layout + ["--zero-stage", "1",
                                                                                  "--micro-batches", "2"], out=out)
        loss_diff = abs(rec["losses"][0] - ref_moe["losses"][0]) / ref_moe["losses"][0]
        norm_diff = abs(rec["grad_norms"][0] - ref_moe["grad_norms"][0]) / ref_moe["grad_norms"][0]
        name = f"bf16 lab09 {rec['layout']}"
        print(f"{name} vs bf16 lab01 --experts 4, step 1: loss {loss_diff:.2e} (bound {BOUND}), gradient norm "
              f"{norm_diff:.2e} (bound {BF16_GRAD_NORM_RTOL})")
        check(loss_diff <= BOUND and norm_diff <= BF16_GRAD_NORM_RTOL, f"{name}: step 1 differs")
        check(rec["losses"][-1] < rec["losses"][0] - 0.3, f"{name} must train")
    plan3d_check(out)


def read_checkpoint(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def weights(path):
    """The parameters' bytes of a checkpoint (not the moments)."""
    header, data = read_checkpoint(path)
    ends = [v["data_offsets"] for k, v in header.items() if k != "__metadata__" and not k.startswith("optimizer.")]
    return data[:max(e for _, e in ends)]


def same_weights_after_lr0(tmp, saved, lab, n, flags):
    """Resume `saved` with --lr 0 (no weight decay) for one step and save: the weights
    that come back are the ones the run read."""
    again = f"{tmp}/{lab}-lr0.safetensors"
    rec, _, _ = run(lab, n, MODEL + flags + ["--steps", "1", "--lr", "0", "--weight-decay", "0", "--resume", saved,
                                             "--save", again])
    check(rec["first_step"] == 10, f"{lab}: resumed at step {rec['first_step']}, want 10")
    check(weights(again) == weights(saved), f"{lab} {' '.join(flags)}: the weights read differ from those written")
    print(f"{lab} -n {n} {' '.join(flags)}: read back bit for bit what {os.path.basename(saved)} holds")


def resume():
    tmp = tempfile.mkdtemp(prefix="pl-bf16-ck-")
    bf16_ck, fp32_ck = f"{tmp}/bf16.safetensors", f"{tmp}/fp32.safetensors"
    first, _, _ = run("lab01_dp", 1, MODEL + BF16 + ["--steps", "10", "--save", bf16_ck])
    header, _ = read_checkpoint(bf16_ck)
    check(all(v["dtype"] == "F32" for k, v in header.items() if k != "__metadata__"),
          "a bf16 run saves fp32 tensors (its master weights and moments): the format does not change")
    cont, _, _ = run("lab01_dp", 1, MODEL + BF16 + ["--steps", "10", "--resume", bf16_ck])
    for lab, n, flags in [("lab01_dp", 1, []), ("lab02_zero", 2, ["--zero-stage", "3"])]:
        rec, _, _ = run(lab, n, MODEL + flags + ["--steps", "10", "--resume", bf16_ck])
        check(rec["config"]["precision"] == "fp32" and rec["first_step"] == 10, f"{lab}: an fp32 run resumed at 10")
        # steps 11-20 in fp32 after 10 in bf16: as bf16 throughout, within bf16's difference from fp32
        compare_runs(f"fp32 {lab} -n {n} after bf16 vs bf16 throughout", rec, cont, 2e-2)
        same_weights_after_lr0(tmp, bf16_ck, lab, n, flags)
    run("lab01_dp", 1, MODEL + ["--steps", "10", "--save", fp32_ck])
    for lab, n, flags in [("lab05_tp", 2, BF16), ("lab04_1f1b", 2, BF16 + ["--micro-batches", "2"]),
                          ("lab02_zero", 2, BF16 + ["--zero-stage", "1"]),
                          ("lab06_3d", 4, BF16 + ["--tp", "1", "--pp", "2", "--dp", "2", "--micro-batches", "2",
                                                  "--zero-stage", "1"])]:  # the master weights sharded over DP
        same_weights_after_lr0(tmp, fp32_ck, lab, n, flags)
    shutil.rmtree(tmp, ignore_errors=True)


KINDS = ["gemm", "attention", "layernorm", "gelu", "softmax/loss", "optimizer", "conversions", "residual",
         "embedding", "other"]


def total_of(k):
    return sum(k.values())


def kernel_times():
    for prec in ([], BF16):
        flags = MODEL + ["--steps", "4"] + prec
        plain, _, _ = run("lab01_dp", 1, flags)
        check("kernel_ms_per_step" not in plain, "timing by kernel kind must be off without PL_KERNEL_TIMES")
        os.environ["PL_KERNEL_TIMES"] = "1"
        timed, p, _ = run("lab01_dp", 1, flags)
        del os.environ["PL_KERNEL_TIMES"]
        name = plain["config"]["precision"]
        check(timed["losses"] == plain["losses"], f"{name}: timing the kernels must not change a bit of the run")
        k = timed["kernel_ms_per_step"]
        print(name, " | ".join(f"{x} {k[x]:.3f}" for x in k), "ms per step")
        check(list(k) == KINDS, f"{name}: kinds {list(k)}, want {KINDS}")
        ran = [x for x in KINDS if x not in ("conversions", "other")]  # fp32 converts nothing
        check(all(k[x] > 0 for x in ran), f"{name}: every kernel kind a step runs must have time")
        # the master weights rounded to bf16 after each step; in fp32 they are the weights (a no-op call)
        check(k["conversions"] > 0 if name == "bf16" else k["conversions"] < 0.01 * total_of(k),
              f"{name}: conversions {k['conversions']:.4f} ms: work in bf16 only")
        check(k["other"] >= 0, f"{name}: the kernels cannot take more than the step")
        mean = sum(timed["step_ms"][1:]) / len(timed["step_ms"][1:])
        total = total_of(k)
        check(abs(total - mean) <= 0.05 * mean, f"{name}: kinds + other = {total:.3f} ms, the steps' mean {mean:.3f} ms")
        check("kernel time" in p.stdout and "gemm" in p.stdout, f"{name}: the summary must print the breakdown")


if __name__ == "__main__":
    {"equivalence": equivalence, "resume": resume, "kernel_times": kernel_times}[sys.argv[1]]()
    print("passed")
