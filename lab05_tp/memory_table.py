#!/usr/bin/env python3
"""The lesson's tables of sequence parallelism and recomputation, from runs.

Memory: lab05 at t = 2 and 4, on the default model and on a long-sequence one
(--seq 256 --batch 8: the same 2048 tokens per step), under TP, TP + SP,
TP + selective, TP + SP + selective, TP + full and TP + SP + full, one step
each (memory per step does not depend on the step count): the allocator's
activation peak per rank beside theory.h's formula, and the formula's share of
the T^2 term (the attention matrices).

Time: lab01 -n 1 and lab05 -n 2 under each --recompute mode, R repeats taken
in turn (none, selective, full, none, ...) so that the machine's load falls on
every mode alike; the median step of each run; the ratios full/none and
selective/none of the medians beside the FLOP ratio of theory.h
(th_flops_per_token + th_recompute_flops_per_token over th_flops_per_token).

usage (from build/): python3 ../lab05_tp/memory_table.py [--build .] [--repeats 3] [--steps 8] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

DEFAULT = []                                  # the labs' default model: 8 layers, d_model 128, 4 heads, seq 64, batch 32
LONG = ["--seq", "256", "--batch", "8"]       # the same tokens per step, four times the sequence
COMBOS = [("TP", []), ("TP + SP", ["--sequence-parallel"]),
          ("TP + selective", ["--recompute", "selective"]),
          ("TP + SP + selective", ["--sequence-parallel", "--recompute", "selective"]),
          ("TP + full", ["--recompute", "full"]), ("TP + SP + full", ["--sequence-parallel", "--recompute", "full"])]


def run(build, lab, n, args, out):
    cmd = ["mpirun", "-n", str(n), os.path.join(build, lab), *args, "--device", "cpu", "--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    if p.returncode:
        sys.exit(f"error: {' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    with open(os.path.join(out, "records.jsonl")) as f:
        return json.loads(f.read().splitlines()[-1]), " ".join(["mpirun", "-n", str(n), "./" + lab, *args])


def mb(x):
    return f"{x / 1e6:.2f}"


def memory(build, out, quick):
    shapes = [("default (T 64, B 32)", ["--layers", "2", "--d-model", "32", "--seq", "16"] if quick else DEFAULT),
              ("--seq 256 --batch 8", ["--layers", "2", "--d-model", "32", "--seq", "32", "--batch", "4"] if quick
               else LONG)]
    print("| model | t | run | activations per rank, measured (MB) | formula (MB) | equal | T^2 share |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, shape in shapes:
        for t in (2, 4):
            for combo, flags in COMBOS:
                rec, cmd = run(build, "lab05_tp", t, shape + flags + ["--steps", "1"], out)
                measured, formula = rec["mem_peak_bytes_per_rank"]["acts"], rec["acts_peak_bytes_formula_per_rank"]
                kinds = rec["acts_bytes_by_kind_formula"]
                share = kinds["quadratic"] / sum(kinds.values())
                print(f"| {name} | {t} | {combo} | {mb(max(measured))} | {mb(max(formula))} | "
                      f"{'yes' if measured == formula else 'NO'} | {100 * share:.1f} % |", flush=True)


def times(build, out, repeats, steps, quick):
    shape = ["--layers", "2", "--d-model", "32", "--seq", "16"] if quick else DEFAULT
    modes = ("none", "selective", "full")
    print(f"\n| run | mode | median step per repeat (ms) | ratio to none, per repeat | ratio of the medians | "
          f"FLOP ratio (theory.h) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for lab, n in (("lab01_dp", 1), ("lab05_tp", 2)):
        med = {m: [] for m in modes}
        flops = {}
        for _ in range(repeats):
            for m in modes:  # in turn, so a busy spell falls on every mode
                rec, _ = run(build, lab, n, shape + ["--steps", str(steps), "--recompute", m], out)
                med[m].append(rec["step_ms_median"])
                flops[m] = (rec["flops_per_token_formula"] + rec["recompute_flops_per_token_formula"]) / \
                    rec["flops_per_token_formula"]
        for m in modes:
            per = [a / b for a, b in zip(med[m], med["none"])]
            print(f"| {lab} -n {n} | {m} | {' / '.join(f'{x:.1f}' for x in med[m])} | "
                  f"{' / '.join(f'{x:.2f}' for x in per)} | "
                  f"{statistics.median(med[m]) / statistics.median(med['none']):.2f} | {flops[m]:.3f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=".", help="folder with the lab programs [.]")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="a tiny model: the plumbing only")
    ap.add_argument("--skip-times", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    out = tempfile.mkdtemp(prefix="pl-memory-table-")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    memory(build, out, a.quick)
    if not a.skip_times:
        times(build, out, a.repeats, a.steps, a.quick)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
