#!/usr/bin/env python3
"""The verdict of a device check: reads the result set that device_check.py wrote
(or a fake one, in the CTest device_check_checker) and fails on anything short of
a complete, correct run.

A result set is JSON:
  {"runs": [{"name", "kind": "lab"|"ctest"|"sanitizer", "cmd",
             "status": "done"|"timeout"|"skipped"|"error", "reason",
             "exit", "expect_exit" (0), "seconds", "log",
             "record": the lab's run record (last line of records.jsonl) or null,
             "expect": {"device": .., "comm": .., "steps": N, "config": {..}, other record keys: value},
             "expect_output": text the log must contain}],
   "compare": [{"a", "b", "a_steps": [lo, hi] | null, "b_steps": [lo, hi] | null,
                "rtol", "why"}],
   "notes": ["..."]}

Failures: a planned run that was skipped (for budget, or a test that reported
"skipped" / "not run"), timed out, or exited otherwise than expected; a lab run
without a record, with another device or comm than expected, with a record key
not as expected, with losses not finite or not one per step; a comparison whose
runs are missing, whose loss arrays (the whole arrays, or the slices named) differ
in length, or differ anywhere by more than rtol relative (|a - b| / |b|).

usage: check_results.py RESULTS.json [--summary FILE.md]     exit 0 all good, 1 not"""
import argparse
import json
import math
import sys

ONE_GPU_LIMITS = """\
What one GPU cannot show (these need a machine with a GPU per rank):
- NCCL with more than one rank: every run here with 2 ranks shares the one GPU, so it
  communicates through MPI, staged through host memory; NCCL ran only at 1 rank, where
  its all-reduce moves nothing.
- NCCL send/recv between pipeline stages (lab03, lab04, lab06), and ncclCommSplit with
  several members (lab06's TP, PP and DP groups): at -n 2 here they are MPI.
- Real overlap of communication with compute on the comm stream (lab01 --bucket-mb):
  at -n 1 the second stream has nothing to send, at -n 2 the buckets go over MPI.
- Bandwidth, scaling across GPUs and NVLink figures of any kind."""


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


def verdict(results):
    """(failures, summary lines in markdown)."""
    runs = {r["name"]: r for r in results.get("runs", [])}
    failures, good = [], {}
    lines = ["| run | status | s | device/comm | final loss | tok/s | model FLOP/s |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
    for r in results.get("runs", []):
        bad = check_run(r)
        failures += bad
        good[r["name"]] = not bad
        rec = r.get("record") or {}
        losses = rec.get("losses") or [None]
        status = "ok" if not bad else ("SKIPPED" if r.get("status") == "skipped" else "FAILED")
        dc = f"{rec['device']}/{rec['comm']}" if rec.get("device") else "-"
        lines.append(f"| {r['name']} | {status} | {fmt(r.get('seconds'), '.1f')} | {dc} | "
                     f"{fmt(losses[-1], '.6f')} | {fmt(rec.get('tokens_per_s'), '.4g')} | "
                     f"{fmt(rec.get('model_flops_per_s'), '.3g')} |")
    lines += ["", "| compare | steps | max relative difference | bound | why |", "| --- | --- | ---: | ---: | --- |"]
    for c in results.get("compare", []):
        bad, d = check_comparison(c, runs, good)
        failures += bad
        steps = f"{c.get('a_steps') or 'all'} / {c.get('b_steps') or 'all'}"
        lines.append(f"| {c['a']} vs {c['b']} | {steps} | {fmt(d, '.2e')}{' FAILED' if bad else ''} | "
                     f"{c['rtol']:g} | {c.get('why', '')} |")
    for n in results.get("notes", []):
        lines.append(f"\nnote: {n}")
    return failures, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--summary", help="also write the summary (markdown) here")
    args = ap.parse_args()
    with open(args.results) as f:
        results = json.load(f)
    failures, lines = verdict(results)
    n_runs, n_cmp = len(results.get("runs", [])), len(results.get("compare", []))
    if not n_runs:
        failures.append("no runs in the result set")
    tail = [""] + [f"FAILED: {x}" for x in failures]
    tail.append(f"{'all device checks passed' if not failures else f'{len(failures)} failure(s)'}: "
                f"{n_runs} runs, {n_cmp} comparisons")
    text = "\n".join(lines + ["", ONE_GPU_LIMITS] + tail) + "\n"
    print(text, end="")
    if args.summary:
        with open(args.summary, "w") as f:
            f.write("# Device check\n\n" + text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
