#!/usr/bin/env python3
"""The verdict of a device check: reads the result set that device_check.py wrote
(or a fake one, in the CTest device_check_checker) and fails on anything short of
a complete, correct run.

A result set is JSON:
  {"mode": "device"|"rehearsal", "gpu": nvidia-smi's name, "elapsed_s", "hard_end_s",
   "phases": {"A": {"title", "state": "not reached"|"running"|"done", "seconds"}, ..},
   "runs": [{"name", "phase": "A"|"B"|"C", "kind": "lab"|"dry-run"|"ctest"|"sanitizer"|"plan3d", "cmd",
             "status": "done"|"timeout"|"skipped"|"error", "reason",
             "exit", "expect_exit" (0), "seconds", "limit_s", "log",
             "record": the lab's run record (last line of records.jsonl), plan3d's
                       best layout, or null,
             "expect": {"device": .., "comm": .., "steps": N, "config": {..}, other record keys: value},
             "expect_output": text the log must contain}],
   "compare": [{"a", "b", "phase", "a_steps": [lo, hi] | null, "b_steps": [lo, hi] | null,
                "rtol", "why"}],
   "notes": ["..."]}

Failures: a phase not reached or still running; a run phase A must hold
(PHASE_A_REQUIRED) missing; a planned run that was skipped (for the hard end, or a
test that reported "skipped" / "not run"), timed out, or exited otherwise than
expected, or refused (exit 2) in other than one "error:" line; a lab run without a record, with another device or comm than expected,
with a record key not as expected, with losses not finite or not one per step; a
plan3d run without a prediction; a comparison whose runs are missing, whose loss
arrays (the whole arrays, or the slices named) differ in length, or differ
anywhere by more than rtol relative (|a - b| / |b|).

The summary: the verdict of each phase, gpt2-small's tok/s, model FLOP/s and MFU
(over PEAKS, by the GPU's name and the run's precision) beside plan3d's
prediction, each phase's runs and comparisons, and what one GPU cannot show.

usage: check_results.py RESULTS.json [--summary FILE.md]     exit 0 all good, 1 not"""
import argparse
import json
import math
import sys

PHASES = ("A", "B", "C")
PHASE_TITLES = {
    "A": "the GPU alone: kernels vs their CPU twins, lab01 CUDA vs CPU, gpt2-small fp32 and bf16 alone (MFU) beside plan3d",
    "B": "the lab matrix: layouts at 1 and 2 ranks on CUDA and CPU (lab07's CP algorithms too), bf16, SP, "
         "recomputation, schedules, checkpoints, lab08's experts on the CPU",
    "C": "the ctests labelled gpu and compute-sanitizer"}
G2_RUN = "gpt2-small cuda {}"        # the throughput runs, by precision
PLAN_RUN = "plan3d gpt2-small {}"    # plan3d's prediction for them
# Phase A must hold these (a rehearsal without a GPU: those that need none).
PHASE_A_REQUIRED = ["ctest gpu_kernels_vs_cpu", "lab01 cuda n1", "lab01 cpu n1", G2_RUN.format("fp32"),
                    G2_RUN.format("bf16"), PLAN_RUN.format("fp32"), PLAN_RUN.format("bf16")]
# Dense peaks per GPU, TFLOP/s (NVIDIA's datasheets; dense = without 2:4 sparsity):
# bf16: the tensor cores' BF16 figure; fp32: the plain FP32 figure, not TF32's,
# since the labs' fp32 GEMMs use CUBLAS_COMPUTE_32F without TF32 (common/kernels_cuda.cu).
# H100 SXM and H200 SXM share the compute: 989.4 BF16, 66.9 FP32; A100: 312, 19.5.
PEAKS = (("H200", {"bf16": 989.4, "fp32": 66.9}), ("H100", {"bf16": 989.4, "fp32": 66.9}),
         ("A100", {"bf16": 312.0, "fp32": 19.5}))

ONE_GPU_LIMITS = """\
What one GPU cannot show (these need a machine with a GPU per rank):
- NCCL with more than one rank: every run here with 2 ranks shares the one GPU, so it
  communicates through MPI, staged through host memory; NCCL ran only at 1 rank, where
  its all-reduce moves nothing.
- NCCL send/recv between pipeline stages (lab03, lab04, lab06), and ncclCommSplit with
  several members (lab06's TP, PP and DP groups): at -n 2 here they are MPI.
- Real overlap of communication with compute on the comm stream (lab01 --bucket-mb):
  at -n 1 the second stream has nothing to send, at -n 2 the buckets go over MPI.
- Bandwidth, scaling across GPUs and NVLink figures of any kind; and so the MFU of one
  GPU alone is an upper bound for a layout that communicates."""


def peak_tflops(gpu, precision):
    """The dense peak (TFLOP/s) of the GPU named (nvidia-smi's name) in that precision, or None."""
    for key, peaks in PEAKS:
        if key in (gpu or ""):
            return peaks.get(precision)
    return None


def mfu(record, gpu):
    """(model FLOP/s over the peak of the record's precision on that GPU, the peak in TFLOP/s), or (None, peak)."""
    precision = (record.get("config") or {}).get("precision", "fp32")
    peak = peak_tflops(gpu, precision)
    flops = record.get("model_flops_per_s")
    if peak is None or not flops or record.get("device") != "cuda":
        return None, peak
    return flops / (peak * 1e12), peak


def relative_difference(a, b):
    """max over i of |a_i - b_i| / |b_i| (b_i = 0: absolute); inf if any value is not finite."""
    worst = 0.0
    for x, y in zip(a, b):
        if not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        worst = max(worst, abs(x - y) / (abs(y) if y != 0 else 1.0))
    return worst


def check_run(run):
    """The failures of one planned run (a list of strings, empty when it is good)."""
    name, status = run["name"], run.get("status")
    if status == "skipped":
        return [f"{name}: not run ({run.get('reason', 'skipped')}): an incomplete check is a failed check"]
    if status == "timeout":
        return [f"{name}: timed out after {run.get('seconds', 0):.0f} s"]
    if status != "done":
        return [f"{name}: {status or 'no status'} ({run.get('reason', '')})"]
    want_exit = run.get("expect_exit", 0)
    if run.get("exit") != want_exit:
        return [f"{name}: exit status {run.get('exit')}, expected {want_exit} (log: {run.get('log', '?')})"]
    bad = []
    needle = run.get("expect_output")
    if needle is not None and needle not in run.get("output", ""):
        bad.append(f"{name}: the output does not contain {needle!r}")
    if want_exit == 2:  # bad input: one line from rank 0, not one per rank, whatever else the machine prints
        errors = [line for line in run.get("output", "").splitlines() if line.startswith("error:")]
        if len(errors) != 1:
            bad.append(f"{name}: refused in {len(errors)} 'error:' lines, expected one")
    if run.get("kind") == "plan3d":
        rec = run.get("record") or {}
        if not rec.get("tokens_per_s", 0) > 0:
            bad.append(f"{name}: no prediction (no layout in its --json)")
        return bad
    if run.get("kind") != "lab" or want_exit != 0:
        return bad
    rec = run.get("record")
    if not rec:
        return bad + [f"{name}: no run record"]
    for key, want in run.get("expect", {}).items():
        if key == "steps":
            n = len(rec.get("losses", []))
            if n != want:
                bad.append(f"{name}: {n} losses in the record, expected {want}")
        elif key == "config":
            for k, v in want.items():
                if rec.get("config", {}).get(k) != v:
                    bad.append(f"{name}: config {k} = {rec.get('config', {}).get(k)!r}, expected {v!r}")
        elif rec.get(key) != want:
            bad.append(f"{name}: record {key} = {rec.get(key)!r}, expected {want!r}")
    losses = rec.get("losses", [])
    if not losses or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
        bad.append(f"{name}: losses missing or not finite: {losses[:4]}")
    return bad


def sliced(losses, steps):
    return losses if steps is None else losses[steps[0]:steps[1]]


def check_comparison(c, runs, good):
    """(failures, measured difference or None) of one comparison."""
    a, b = runs.get(c["a"]), runs.get(c["b"])
    for side, r in (("a", a), ("b", b)):
        if r is None:
            return [f"compare {c['a']} / {c['b']}: {c[side]} was not planned"], None
        if not good.get(r["name"]) or not r.get("record"):
            return [f"compare {c['a']} / {c['b']}: {r['name']} did not complete, nothing to compare"], None
    la = sliced(a["record"]["losses"], c.get("a_steps"))
    lb = sliced(b["record"]["losses"], c.get("b_steps"))
    if not la or len(la) != len(lb):
        return [f"compare {c['a']} / {c['b']}: {len(la)} vs {len(lb)} losses"], None
    d = relative_difference(la, lb)
    if not d <= c["rtol"]:
        return [f"compare {c['a']} / {c['b']}: losses differ by {d:.3e} relative > bound {c['rtol']:g} "
                f"({c.get('why', '')})"], d
    return [], d


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def required_missing(results):
    """The runs phase A must hold that the result set lacks."""
    names = {r["name"] for r in results.get("runs", [])}
    need = PHASE_A_REQUIRED
    if results.get("mode") == "rehearsal":
        need = [n for n in need if "cuda" not in n and not n.startswith("ctest")]
    return [n for n in need if n not in names]


def run_failures(runs):
    """The failures of a phase's runs: those that did not start for the same reason
    make one line; (failures, {name: good})."""
    failures, good, unstarted = [], {}, {}
    for r in runs:
        bad = check_run(r)
        good[r["name"]] = not bad
        if r.get("status") == "skipped" and "record" not in r:
            unstarted.setdefault(r.get("reason", "skipped"), []).append(r["name"])
        else:
            failures += bad
    for reason, names in unstarted.items():
        if len(names) > 3:
            failures.append(f"{len(names)} runs not run ({reason}): {', '.join(names[:3])}, ...")
        else:
            failures += [f"{n}: not run ({reason}): an incomplete check is a failed check" for n in names]
    return failures, good


def gpt2_table(results):
    """gpt2-small alone on the GPU, measured beside plan3d's prediction."""
    gpu = results.get("gpu", "")
    runs = {r["name"]: r for r in results.get("runs", [])}
    lines = [f"## gpt2-small alone on the GPU ({gpu or 'unknown'}), beside plan3d", "",
             "| precision | steps | tok/s | model TFLOP/s | peak TFLOP/s | MFU | plan3d tok/s | plan3d MFU | measured / predicted |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for precision in ("fp32", "bf16"):
        rec = (runs.get(G2_RUN.format(precision)) or {}).get("record") or {}
        pred = (runs.get(PLAN_RUN.format(precision)) or {}).get("record") or {}
        share, peak = mfu(rec, gpu)
        if peak is None:
            peak = peak_tflops(gpu, precision)
        tok, ptok = rec.get("tokens_per_s"), pred.get("tokens_per_s")
        ratio = tok / ptok if tok and ptok else None
        flops = rec.get("model_flops_per_s")
        lines.append(f"| {precision} | {len(rec.get('losses', [])) or '-'} | {fmt(tok, '.4g')} | "
                     f"{fmt(flops / 1e12 if flops else None, '.1f')} | {fmt(peak, 'g')} | "
                     f"{fmt(share * 100 if share is not None else None, '.1f')}{' %' if share is not None else ''} | "
                     f"{fmt(ptok, '.4g')} | {fmt(pred['mfu'] * 100 if 'mfu' in pred else None, '.1f')}"
                     f"{' %' if 'mfu' in pred else ''} | {fmt(ratio, '.2f')} |")
    lines += ["", "MFU = the record's model FLOP/s (median step) over the dense peak of its precision: "
              "bf16 the tensor cores' BF16 peak, fp32 the plain FP32 peak (the labs' fp32 GEMMs use no TF32). "
              "plan3d predicts the same model on one GPU of its preset (fp32 at that FP32 peak, "
              "--gpu-tflops), at its one efficiency figure for every GPU (0.57 of peak in the layers)."]
    if peak_tflops(gpu, "bf16") is None:
        lines.append(f"No peak is known for the GPU '{gpu}': no MFU (check_results.py's PEAKS).")
    return lines


def phase_tables(runs, compares, good, gpu):
    lines = ["| run | status | s | limit s | device/comm | final loss | tok/s | model FLOP/s | MFU |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in runs:
        rec = r.get("record") or {}
        losses = rec.get("losses") or [None]
        status = "ok" if good[r["name"]] else ("SKIPPED" if r.get("status") == "skipped" else "FAILED")
        dc = f"{rec['device']}/{rec['comm']}" if rec.get("device") else "-"
        share, _ = mfu(rec, gpu)
        lines.append(f"| {r['name']} | {status} | {fmt(r.get('seconds'), '.1f')} | {fmt(r.get('limit_s'), 'g')} | "
                     f"{dc} | {fmt(losses[-1], '.6f')} | {fmt(rec.get('tokens_per_s'), '.4g')} | "
                     f"{fmt(rec.get('model_flops_per_s'), '.3g')} | "
                     f"{fmt(share * 100 if share is not None else None, '.1f')} |")
    if compares:
        lines += ["", "| compare | steps | max relative difference | bound | why |",
                  "| --- | --- | ---: | ---: | --- |"]
    return lines


def report(results):
    """(failures, summary.md's text) of a result set, complete or cut short."""
    gpu = results.get("gpu", "")
    runs = results.get("runs", [])
    byname = {r["name"]: r for r in runs}
    states = results.get("phases", {})
    failures, good, verdicts, body = [], {}, [], []
    for p in PHASES:
        in_p = [r for r in runs if r.get("phase", "A") == p]
        cmp_p = [c for c in results.get("compare", []) if c.get("phase", "A") == p]
        state = states.get(p, {}).get("state", "done")
        bad, g = run_failures(in_p)
        good.update(g)
        table = phase_tables(in_p, cmp_p, g, gpu)
        for c in cmp_p:
            cbad, d = check_comparison(c, byname, good)
            bad += cbad
            steps = f"{c.get('a_steps') or 'all'} / {c.get('b_steps') or 'all'}"
            table.append(f"| {c['a']} vs {c['b']} | {steps} | {fmt(d, '.2e')}{' FAILED' if cbad else ''} | "
                         f"{c['rtol']:g} | {c.get('why', '')} |")
        if p == "A":
            bad += [f"phase A: the run '{n}' is missing from the result set" for n in required_missing(results)]
        title = states.get(p, {}).get("title", PHASE_TITLES[p])
        took = states.get(p, {}).get("seconds")
        when = f", {took:.0f} s" if took is not None else ""
        if state in ("not reached", "running"):
            verdicts.append(f"- phase {p}: {state.upper()} ({len(in_p)} runs)")
            failures.append(f"phase {p}: {state} ({len(in_p)} runs not yet run)")
        else:
            verdicts.append(f"- phase {p}: {'passed' if not bad else f'FAILED ({len(bad)})'}: {len(in_p)} runs, "
                            f"{len(cmp_p)} comparisons{when}")
            failures += bad
        body += ["", f"## Phase {p}: {title}", ""] + table
    n_runs, n_cmp = len(runs), len(results.get("compare", []))
    if not n_runs:
        failures.append("no runs in the result set")
    head = [f"# Device check{' (rehearsal, no GPU)' if results.get('mode') == 'rehearsal' else ''}", "",
            f"GPU: {gpu or 'unknown'} | {results.get('elapsed_s', '?')} s after the start of the runs; "
            f"hard end at {results.get('hard_end_s', '?')} s", "", "## Verdict", ""] + verdicts
    last = (f"{'all device checks passed' if not failures else f'{len(failures)} failure(s)'}: "
            f"{n_runs} runs, {n_cmp} comparisons")
    head += ["", f"**{last}**", ""]
    tail = ["", ONE_GPU_LIMITS, ""] + [f"FAILED: {x}" for x in failures]
    tail += [f"note: {n}" for n in results.get("notes", [])] + ["", last]
    text = "\n".join(head + gpt2_table(results) + body + tail) + "\n"
    return failures, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--summary", help="also write the summary (markdown) here")
    args = ap.parse_args()
    with open(args.results) as f:
        results = json.load(f)
    failures, text = report(results)
    print(text, end="")
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
