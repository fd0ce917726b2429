#!/usr/bin/env python3
"""Turn run records (the labs' records.jsonl) into the TSV files the gnuplot
scripts in plots/ read: gnuplot cannot parse JSON.

usage: records_to_tsv.py RECORDS.jsonl [MORE.jsonl ...] [--out DIR] [--note TEXT]

Writes into DIR (default: the current folder) whichever of these the records
have runs for; each starts with `# key: value` lines (the chart's subtitle and
the like), then a header line, then one tab-separated row per run:

  bubble.tsv      lab03/lab04 runs: bubble measured (mean, min, max over ranks), theory (unit
                  times) and the schedule's formula on the run's measured times
  memory.tsv      lab01 and lab02 runs at the ZeRO runs' rank count: peak bytes of rank 0
                  per category and the formula of the model states
  acts.tsv        lab04 runs: activation peak (max over stages), measured and formula
  throughput.tsv  every run: tokens/s and median step time
  loss.tsv        every run: the loss of each step, one column per run, baseline first
  comm.tsv        every run on more than one rank: ring bytes per step, measured and formula
  precision.tsv   lab01 -n 1 in fp32 and in bf16 (--precision), when both are there: the loss
                  of each step, fp32 first

When a file holds several runs of the same lab and layout (and batch), the last wins.
A file that is missing, not a regular file, not JSON lines (a last line cut
short by a run that was stopped) or a record without what the charts read is
refused in one line naming the file and line (status 2), before any TSV is
written. A diverged run's null losses are written as NaN: gnuplot leaves a gap.
--note adds a line under the bubble chart's subtitle (the driver says there
whether the ranks outnumbered the cores).
"""
import argparse
import json
import math
import os
import stat
import sys
from collections import Counter

RECORDS_MAX_BYTES = 1 << 30  # as plan3d --check: a million runs' records


class RecordsError(Exception):
    """A records file that cannot be charted: the message is one line naming the file (and line)."""


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_record(r):
    """What every chart reads of a record, or the key that is wrong ("" if all is well)."""
    if not isinstance(r, dict):
        return "a record must be a JSON object"
    if not (isinstance(r.get("lab"), str) and r["lab"][:3] == "lab" and r["lab"][3:5].isdigit()):
        return f"lab {json.dumps(r.get('lab'))}: not a lab's name (lab01_dp ...)"
    if not (isinstance(r.get("ranks"), int) and not isinstance(r["ranks"], bool) and r["ranks"] >= 1):
        return f"ranks {json.dumps(r.get('ranks'))}: must be a whole number of at least 1"
    for key in ("layout", "device", "comm"):
        if not isinstance(r.get(key), str):
            return f"{key} is missing" if key not in r else f"{key}: must be a string"
    c = r.get("config")
    if not isinstance(c, dict):
        return "config is missing" if c is None else "config: must be an object"
    for key in ("steps", "batch", "seq", "layers", "d_model", "heads"):
        if not (isinstance(c.get(key), int) and not isinstance(c[key], bool) and c[key] >= 1):
            return f"config.{key} {json.dumps(c.get(key))}: must be a whole number of at least 1"
    losses = r.get("losses")
    if not (isinstance(losses, list) and all(x is None or _number(x) for x in losses)):
        return "losses: must be a list of numbers (null where a loss was not finite)"
    for key in ("tokens_per_s", "step_ms_median"):
        if not _number(r.get(key)):
            return f"{key} {json.dumps(r.get(key))}: must be a number"
    return ""


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def read_file(path):
    """The records of one records.jsonl, each checked (RecordsError names the file and line). A
    folder, FIFO or device is refused before it is opened: a FIFO would block until written."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise RecordsError(f"{path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise RecordsError(f"{path}: {kind}, not a records file")
    if st.st_size > RECORDS_MAX_BYTES:
        raise RecordsError(f"{path}: {st.st_size} bytes, more than the limit of {RECORDS_MAX_BYTES}")
    try:
        with open(path, "rb") as f:
            data = f.read(RECORDS_MAX_BYTES + 1)
    except OSError as e:
        raise RecordsError(f"{path}: {e.strerror}") from None
    recs = []
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        where = f"{path} line {i + 1}"
        cut = i == len(lines) - 1  # the last line has no newline: the writer may have stopped half-way
        try:
            r = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
        except UnicodeDecodeError:
            raise RecordsError(f"{where}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise RecordsError(f"{where}: not JSON{', the last line cut short' if cut else ''} ({e})") from None
        except ValueError as e:  # NaN, Infinity: Python's json takes them, JSON has them not
            raise RecordsError(f"{where}: not JSON ({e})") from None
        problem = _check_record(r)
        if problem:
            raise RecordsError(f"{where}: {problem}")
        r["_where"] = where  # for the messages of the charts' readers (never written out)
        recs.append(r)
    if not recs:
        raise RecordsError(f"{path}: no records")
    return recs


def read_records(paths):
    recs = []
    for path in paths:
        recs += read_file(path)
    # the last run of a lab, layout, batch and sequence length wins (with experts, of its step
    # count, aux-loss weight and routing too: lab08's load chart and the balance chart vary them
    # at one layout)
    latest = {}
    for r in recs:
        moe = (r["config"]["steps"], r["config"]["aux_loss_coef"], r.get("router"), r.get("balance"),
               r.get("bias_speed")) if r["config"].get("experts") else ()
        latest[(r["lab"], r["layout"], r["config"]["batch"], r["config"]["seq"], precision(r), *moe)] = r
    return list(latest.values())


def lab_no(r):
    return int(r["lab"][3:5])


def precision(r):
    return r["config"].get("precision", "fp32")


def label(r):
    """A short name for a run: `lab04 pp=4 m=8 1f1b` (and ` bf16` for --precision bf16)."""
    return f"{r['lab'][:5]} {r['layout']}" + ("" if precision(r) == "fp32" else f" {precision(r)}")


def model(r):
    c = r["config"]
    return f"model L{c['layers']} C{c['d_model']} H{c['heads']} T{c['seq']}"


def subtitle(recs, steps=True):
    """What the runs have in common: device, model, batch, steps."""
    def common(f, what):
        vals = sorted({f(r) for r in recs}, key=str)
        return vals[0] if len(vals) == 1 else f"{what} varies"
    parts = [common(lambda r: f"{r['device']}/{r['comm']}", "device"), common(model, "model"),
             common(lambda r: f"global batch {r['config']['batch']}", "global batch")]
    if steps:
        parts.append(common(lambda r: f"{r['config']['steps']} steps", "steps"))
    return ", ".join(parts)


def fmt(x):
    """A TSV cell. A record's null (a loss that was not finite) and a NaN become
    "NaN", which gnuplot reads as an undefined point: a gap in the curve."""
    if x is None:
        return "NaN"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "NaN"
        return str(int(x)) if x == int(x) and abs(x) < 1e18 else f"{x:.6g}"
    return str(x)


def write_tsv(path, meta, header, rows):
    with open(path, "w") as f:
        f.write("# parallel-labs chart data, written by plots/records_to_tsv.py\n")
        for k, v in meta.items():
            f.write(f"# {k}: {v}\n")
        f.write("\t".join(header) + "\n")
        for row in rows:
            f.write("\t".join(fmt(x) for x in row) + "\n")
    return path


def bubble(recs, note):
    rows = []
    runs = [r for r in recs if "bubble" in r and r["lab"] in ("lab03_pp_naive", "lab04_1f1b")]
    for r in runs:
        meas = r["bubble"]["measured"]
        sched = r.get("schedule", "naive")
        m = r.get("micro_batches", 1)
        rows.append((r["ranks"], sched, m, r["bubble"]["theory"], sum(meas) / len(meas), min(meas), max(meas),
                     r["step_ms_median"], r.get("bubble_formula", r["bubble"]["theory"])))
    order = ["naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"]
    rows.sort(key=lambda x: (x[0], order.index(x[1]) if x[1] in order else 9, x[2]))
    return runs, {"subtitle": subtitle(runs), "note": note, "ps": " ".join(str(p) for p in sorted({x[0] for x in rows}))}, \
        ["p", "schedule", "m", "theory", "measured_mean", "measured_min", "measured_max", "step_ms",
         "formula_measured_times"], rows


def memory(recs):
    zero = [r for r in recs if r["lab"] == "lab02_zero"]
    dp = [r for r in recs if r["lab"] == "lab01_dp"]
    n = max(r["ranks"] for r in (zero or dp)) if (zero or dp) else 0
    runs = sorted([r for r in dp + zero if r["ranks"] == n], key=lambda r: (lab_no(r), r.get("zero_stage", 0)))
    rows = []
    cats = ["params", "grads", "optim", "acts", "comm", "workspace"]
    names = {0: "16Ψ (replicated)", 1: "8Ψ + 8Ψ/N", 2: "4Ψ + 12Ψ/N", 3: "16Ψ/N"}
    for r in runs:
        per_rank = r["mem_peak_bytes_per_rank"]
        stage = r.get("zero_stage", 0)
        formula = sum(r["mem_formula_bytes"].values()) if "mem_formula_bytes" in r else 16 * r["params"]
        name = "DP" if stage == 0 else f"ZeRO-{stage}"
        rows.append([name, r["ranks"]] + [per_rank.get(c, [0])[0] for c in cats] + [per_rank["total"][0], formula, names[stage]])
    psi = runs[0]["params"] if runs else 0
    return runs, {"subtitle": f"N = {n} ranks, Ψ = {psi:,} parameters (fp32, AdamW), " + subtitle(runs, False)}, \
        ["run", "ranks"] + cats + ["total", "formula_states", "formula"], rows


def acts(recs):
    """Two series per schedule: the global batch fixed (the most common batch) and
    the micro-batch size fixed (the most common rows per micro-batch among the others)."""
    runs = [r for r in recs if r["lab"] == "lab04_1f1b" and "acts_peak_measured_bytes" in r
            and r["schedule"] in ("gpipe", "1f1b")]  # the chart compares these two
    if not runs:
        return runs, {}, [], []
    p = Counter(r["ranks"] for r in runs).most_common(1)[0][0]
    runs = [r for r in runs if r["ranks"] == p]
    rows_of = lambda r: r["config"]["batch"] // r["micro_batches"]  # noqa: E731
    batch = Counter(r["config"]["batch"] for r in runs).most_common(1)[0][0]
    others = [rows_of(r) for r in runs if r["config"]["batch"] != batch] or [rows_of(r) for r in runs]
    micro = Counter(others).most_common(1)[0][0]
    rows = []
    for series, keep in (("batch", lambda r: r["config"]["batch"] == batch), ("micro", lambda r: rows_of(r) == micro)):
        for r in sorted(filter(keep, runs), key=lambda r: (r["schedule"], r["micro_batches"])):
            rows.append((series, r["schedule"], r["micro_batches"], r["config"]["batch"], rows_of(r),
                         max(r["acts_peak_measured_bytes"]), max(r["acts_peak_bytes_formula_per_rank"]),
                         r["acts_bytes_per_micro_batch"][0]))
    sub = f"p = {p} stages, " + subtitle(runs, False).split(", global batch")[0]
    return runs, {"subtitle": sub, "p": p, "fixed_batch": batch, "fixed_rows": micro}, \
        ["series", "schedule", "m", "batch", "rows_per_micro", "peak_measured", "peak_formula",
         "stage0_bytes_per_micro"], rows


def throughput(recs):
    runs = sorted(recs, key=lambda r: (lab_no(r), r["ranks"], r["layout"]))
    base = [r["tokens_per_s"] for r in runs if r["lab"] == "lab01_dp" and r["ranks"] == 1]
    rows = [(label(r), lab_no(r), r["ranks"], r["tokens_per_s"], r["step_ms_median"]) for r in runs]
    return runs, {"subtitle": subtitle(runs), "baseline": base[0] if base else "NaN"}, \
        ["run", "lab_no", "ranks", "tokens_per_s", "step_ms_median"], rows


def loss(recs):
    recs = [r for r in recs if not r["config"].get("experts")]  # a mixture of experts is another model
    runs = sorted(recs, key=lambda r: (lab_no(r), r["ranks"], r["layout"], precision(r) != "fp32"))
    base = [r for r in runs if r["lab"] == "lab01_dp" and r["ranks"] == 1]
    runs = base[:1] + [r for r in runs if r not in base[:1]]
    steps = max((len(r["losses"]) for r in runs), default=0)
    rows = []
    for s in range(steps):
        rows.append([s + 1] + [r["losses"][s] if s < len(r["losses"]) else float("nan") for r in runs])
    meta = {"subtitle": subtitle(runs), "baseline": label(runs[0]) if runs else "",
            "series": len(runs), "labs": " ".join(str(lab_no(r)) for r in runs)}
    # losses keep 17 digits: the differences from the baseline are ~1e-7; null or NaN: gnuplot's "NaN"
    return runs, meta, ["step"] + [label(r) for r in runs], \
        [[row[0]] + [repr(float(x)) if _number(x) and math.isfinite(x) else "NaN" for x in row[1:]] for row in rows]


def precision_loss(recs):
    """loss() of lab01 -n 1's fp32 and bf16 runs; nothing unless both are there."""
    one = [r for r in recs if r["lab"] == "lab01_dp" and r["ranks"] == 1]
    if {precision(r) for r in one} != {"fp32", "bf16"}:
        return [], {}, [], []
    return loss(one)


def comm(recs):
    runs = sorted([r for r in recs if r["ranks"] > 1], key=lambda r: (lab_no(r), r["ranks"], r["layout"]))
    rows = []
    for r in runs:
        f = r.get("comm_formula_bytes_per_step", -1)
        rows.append((label(r), lab_no(r), r["ranks"], r["comm_ring_bytes_per_step"],
                     float(f) if f is not None and f >= 0 else float("nan"), sum(r["comm_bytes_per_step"].values()),
                     round(sum(r["comm_calls_per_step"].values())), LINK_OF_LAB.get(lab_no(r), 4),
                     # what a rank sends: the ring traffic without what point to point receives
                     r["comm_ring_bytes_per_step"] - r["comm_bytes_per_step"].get("recv", 0)))
    return runs, {"subtitle": subtitle(runs, False) + ", max over ranks"}, \
        ["run", "lab_no", "ranks", "ring_bytes", "formula_bytes", "payload_bytes", "calls", "link", "sent_bytes"], rows


# the link each technique needs (comm.gp's colours): 1 any (DP, ZeRO: one step's gradient, overlappable),
# 2 the network between hosts is enough (pipelines: point to point, travels while others compute),
# 3 the fastest, inside a host (TP: blocking, inside every layer), 4 each group on its own (3D),
# 5 fast, a node or a fast network (CP, EP: inside every layer; CP's ring overlaps attention)
LINK_OF_LAB = {1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 4, 7: 5, 8: 5}


def spacts(recs):
    """lab05's activation peak per rank by kind, as the allocator lays the block
    out (the layers' T^2 att pieces, their other pieces, the rest), beside the
    formula's total, for every t, --sequence-parallel and --recompute run."""
    runs = [r for r in recs if r["lab"] == "lab05_tp" and "acts_block_bytes_by_kind" in r]
    order = {"none": 0, "selective": 1, "full": 2}
    runs.sort(key=lambda r: (r["tp"], r["sequence_parallel"], order[r["config"]["recompute"]]))
    rows = []
    for r in runs:
        k, f = r["acts_block_bytes_by_kind"], r["acts_bytes_by_kind_formula"]
        mode = r["config"]["recompute"]
        name = ("SP" if r["sequence_parallel"] else "TP" if r["tp"] > 1 else "serial") + \
            ("" if mode == "none" else " + " + mode)
        rows.append((name, r["tp"], int(r["sequence_parallel"]), mode, k["quadratic"], k["linear"], k["other"],
                     r["mem_peak_bytes_per_rank"]["acts"][0], r["acts_peak_bytes_formula_per_rank"][0],
                     f["quadratic"] / max(1, sum(f.values()))))
    return runs, {"subtitle": subtitle(runs, False) + ", lab05_tp, per rank"}, \
        ["run", "t", "sp", "recompute", "quadratic", "linear", "other", "measured", "formula", "quadratic_share"], rows


def cpseq(recs):
    """lab07's activation peak per rank (measured and formula) and step time
    against T at every CP degree (zig-zag ring runs), then each rank's attention
    kernel time at the largest CP degree and T, zig-zag and contiguous."""
    runs = [r for r in recs if r["lab"] == "lab07_cp" and r["cp_algo"] == "ring" and r["dp"] == 1]
    runs.sort(key=lambda r: (r["cp_layout"], r["cp"], r["config"]["seq"]))
    top = max(runs, key=lambda r: (r["cp"], r["config"]["seq"]), default=None)
    rows = []
    for r in runs:
        att = r["attention_seconds_per_rank"]
        at_top = r["cp"] == top["cp"] and r["config"]["seq"] == top["config"]["seq"]
        if r["cp_layout"] != "zigzag" and not at_top:
            continue
        rows.append((f"cp={r['cp']} {r['cp_layout']} T={r['config']['seq']}", r["cp"], r["cp_layout"], r["config"]["seq"],
                     max(r["mem_peak_bytes_per_rank"]["acts"]), max(r["acts_peak_bytes_formula_per_rank"]),
                     r["step_ms_median"], int(at_top), *[1e3 * x for x in att[:4]] + [0] * (4 - len(att[:4]))))
    c = runs[0]["config"] if runs else {"layers": 0, "d_model": 0, "heads": 0, "batch": 0}
    sub = (f"{runs[0]['device'] if runs else '?'}, model L{c['layers']} C{c['d_model']} H{c['heads']}, T varies, "
           f"global batch {c['batch']}, lab07_cp ring, per rank")
    return runs, {"subtitle": sub}, \
        ["run", "cp", "layout", "T", "acts_measured", "acts_formula", "step_ms", "imbalance_row",
         "att_ms_r0", "att_ms_r1", "att_ms_r2", "att_ms_r3"], rows


def epload(recs):
    """lab08's expert load and all-to-all. The runs with the most steps (one EP layout, the
    aux-loss weight varied): a row per step, the busiest expert's rows (any rank and layer)
    over the uniform mean k N_tok / E. The others (the EP degree varied): a row per run, the
    all-to-all bytes that left rank 0 per step (the routing's exact count, and uniform
    routing's 4 k N_tok C b (N-1)/N x L) and rank 0's all-to-all and expert-matmul time."""
    runs = [r for r in recs if r["lab"] == "lab08_ep"]
    longest = max((r["config"]["steps"] for r in runs), default=0)
    runs.sort(key=lambda r: (r["config"]["steps"] != longest, r["config"]["aux_loss_coef"], r["ep"]))
    rows = []
    for r in runs:
        a = r["config"]["aux_loss_coef"]
        if r["config"]["steps"] == longest:
            for i, m in enumerate(r["expert_rows_max_per_step"]):
                rows.append((f"load aux={a:g}", "load", a, r["ep"], i + 1, m / r["expert_rows_uniform"], "NaN", "NaN",
                             "NaN", "NaN"))
        else:
            rows.append((f"ep={r['ep']}", "scale", a, r["ep"], "NaN", "NaN", r["alltoall_sent_per_step"],
                         r["alltoall_uniform_per_step"], r["alltoall_ms_per_step"], r["experts_ms_per_step"]))
    c = runs[0]["config"] if runs else {"experts": 0, "top_k": 0}
    sub = f"{subtitle(runs, False)}, E = {c['experts']}, top-{c['top_k']}, lab08_ep"
    return runs, {"subtitle": sub}, \
        ["run", "kind", "aux", "ep", "step", "load_ratio", "a2a_sent", "a2a_uniform", "a2a_ms", "experts_ms"], rows


def routing_label(r):
    """--router and --balance as given, with the bias's speed: "sigmoid, bias 0.01"."""
    speed = f" {r['bias_speed']:g}" if r["balance"] == "bias" else f" a = {r['config']['aux_loss_coef']:g}"
    return f"{r['router']}, {r['balance']}{speed}"


def balance(recs):
    """lab01 -n 1 with experts at each routing (--router, --balance, --bias-speed): a row per step,
    for every run the worst layer's max/mean choices per expert and the loss (with the aux
    term where the aux loss balances)."""
    runs = [r for r in recs if r["lab"] == "lab01_dp" and "load_imbalance_per_step" in r]
    runs.sort(key=lambda r: (r["router"], r["balance"], r.get("bias_speed", 0)))
    steps = max((len(r["losses"]) for r in runs), default=0)
    rows = []
    for s in range(steps):
        row = [s + 1]
        for r in runs:
            ok = s < len(r["losses"]) and _number(r["losses"][s])
            row += [repr(float(r["load_imbalance_per_step"][s])) if ok else "NaN",
                    repr(float(r["losses"][s])) if ok else "NaN"]
        rows.append(row)
    c = runs[0]["config"] if runs else {"experts": 0, "top_k": 0}
    # the baseline of the loss panel: Switch's routing (softmax, aux loss), else the first run
    base = next((i for i, r in enumerate(runs) if r["router"] == "softmax" and r["balance"] == "aux"), 0)
    meta = {"subtitle": f"{subtitle(runs)}, E = {c['experts']}, top-{c['top_k']}, lab01_dp -n 1",
            "series": len(runs), "baseline": base + 1, "baseline_name": routing_label(runs[base]) if runs else ""}
    header = ["step"] + [f"{routing_label(r)} {what}" for r in runs for what in ("load", "loss")]
    return runs, meta, header, rows


CHARTS = ("bubble", "memory", "acts", "throughput", "loss", "comm", "spacts", "precision", "cpseq", "epload",
          "balance")


def tables(recs, note="", only=None):
    """{name: (meta, header, rows, runs)} of every chart the records have runs for. A
    chart that cannot read a record raises RecordsError naming the record's line."""
    makers = {"bubble": lambda r: bubble(r, note), "memory": memory, "acts": acts, "throughput": throughput,
              "loss": loss, "comm": comm, "spacts": spacts, "precision": precision_loss, "cpseq": cpseq,
              "epload": epload, "balance": balance}
    made = {}
    for name in CHARTS:
        if only and name not in only:
            continue
        try:
            runs, meta, header, rows = makers[name](recs)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
            # the record that fails alone is the one to name
            for r in recs:
                try:
                    makers[name]([r])
                except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as alone:
                    raise RecordsError(f"{r['_where']}: the {name} chart cannot read it "
                                       f"({type(alone).__name__}: {alone})") from None
            raise RecordsError(f"the {name} chart cannot read these records together ({type(e).__name__}: {e})") from None
        if rows:
            made[name] = (meta, header, rows, runs)
    return made


def convert(paths, out, note="", only=None):
    """Write the TSVs; returns {name: (path, runs)} for those written. Every
    file is read and every table made before the first is written: a bad
    record leaves nothing behind."""
    made = tables(read_records(paths), note, only)
    if os.path.exists(out) and not os.path.isdir(out):
        raise RecordsError(f"--out {out}: not a folder")
    try:
        os.makedirs(out, exist_ok=True)
        return {name: (write_tsv(os.path.join(out, name + ".tsv"), meta, header, rows), runs)
                for name, (meta, header, rows, runs) in made.items()}
    except OSError as e:
        raise RecordsError(f"--out {out}: {e.strerror}: {e.filename}") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", help="records.jsonl files written by the labs (--out DIR/records.jsonl)")
    ap.add_argument("--out", default=".", help="folder for the TSV files [.]")
    ap.add_argument("--note", default="", help="a line added to the bubble chart's subtitle")
    a = ap.parse_args()
    try:
        written = convert(a.records, a.out, a.note)
    except RecordsError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    for name, (path, runs) in written.items():
        print(f"{path}: {len(runs)} runs")


if __name__ == "__main__":
    main()
