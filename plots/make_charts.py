#!/usr/bin/env python3
"""One command from runs to report-ready charts.

Runs a sweep of the labs at small sizes on whatever device the labs pick, collects
their run records, turns them into TSV files (records_to_tsv.py) and draws each
chart with its gnuplot script (plots/*.gp) as PNG and SVG, with an index.md that
shows every chart, the numbers behind it and the commands that produced it.

usage: make_charts.py [--build DIR] [--out DIR] [--docs DIR] [--quick] [--mpirun PATH]
  --build DIR   where the lab programs are [build]
  --out DIR     the charts folder [BUILD/charts]; its runs/ subfolder is replaced
  --docs DIR    also copy each chart's PNG there, with a README.md of captions: the
                images the lessons embed (`make plots` passes docs/charts of the repository)
  --quick       a tiny model and few runs (the test uses it): checks the plumbing
  `make plots` runs it with the defaults and --docs.
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import records_to_tsv  # noqa: E402

CORES = os.cpu_count() or 1

# Sizes of the sweep. `pipe`: the bubble and timeline runs, a model where compute
# dominates the sends (as in lab04_1f1b/bubble_table.sh); `std`: every lab and
# layout at one model and global batch (the labs' defaults); `acts`: activation
# memory, which one step measures exactly.
SIZES = {
    "full": dict(pipe="--layers 8 --d-model 256 --heads 8 --seq 64", pipe_steps=3, micro=(1, 2, 4, 8, 16),
                 std="--layers 8 --d-model 128 --heads 4 --seq 64", std_steps=10, batch=32,
                 acts_micro=(1, 2, 4, 8), acts_rows=4,
                 sp="--layers 8 --d-model 128 --heads 4 --seq 256 --batch 8 --steps 1"),
    "quick": dict(pipe="--layers 8 --d-model 32 --heads 4 --seq 16", pipe_steps=2, micro=(1, 8),
                  std="--layers 4 --d-model 32 --heads 4 --seq 16", std_steps=3, batch=16,
                  acts_micro=(1, 8), acts_rows=2,
                  sp="--layers 2 --d-model 32 --heads 4 --seq 16 --batch 4 --steps 1",
                  cp="--layers 2 --d-model 32 --heads 4 --batch 4 --steps 2", cp_seq=(16, 32),
                  ep="--layers 2 --d-model 32 --heads 4 --seq 16 --batch 8", ep_steps=(2, 4),
                  route="--layers 2 --d-model 32 --heads 4 --seq 16 --batch 8 --steps 4"),
}
# lab07's long-sequence sweep: a tiny model, so the sequence is what grows
SIZES["full"].update(cp="--layers 2 --d-model 64 --heads 4 --batch 4 --steps 4", cp_seq=(128, 256, 512, 1024))
# lab08's: a tiny model, E = 4 top-2; the load over ep_steps[1] steps, the all-to-all over ep_steps[0]
SIZES["full"].update(ep="--layers 2 --d-model 64 --heads 4 --seq 64 --batch 16", ep_steps=(3, 40))
# the routings of lab08 part 3 (DeepSeek-V3's bias against the aux loss): the default model, 50 steps
SIZES["full"].update(route="--steps 50")
ROUTINGS = ("--balance aux", "--balance bias", "--balance bias --bias-speed 0.01", "--router sigmoid --balance aux",
            "--router sigmoid --balance bias --bias-speed 0.01")


# lab04's schedules in the bubble and timeline charts, and the m each can run at
# (lab04_1f1b/schedule.h: interleaved m a multiple of p, zb-h1 m >= p, zb-v m >= 2p-1)
PIPE_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
SCHEDULE_TITLES = {"naive": "naive (lab03)", "gpipe": "GPipe (lab04)", "1f1b": "1F1B (lab04)",
                   "interleaved": "interleaved 1F1B, v = 2 (lab04)", "zb-h1": "ZB-H1 (lab04)", "zb-v": "ZB-V (lab04)"}


def schedule_runs(s, p, m):
    return {"interleaved": m % p == 0, "zb-h1": m >= p, "zb-v": m >= 2 * p - 1}.get(s, True)


def sweep(z):
    """The table of runs: (group, lab, ranks, flags). A group's runs share one
    records.jsonl; a run whose program is not built is skipped."""
    runs = []
    pipe = f"{z['pipe']} --batch {z['batch']} --steps {z['pipe_steps']}"
    for p in (2, 4):  # charts 1 and 2: the bubble as m grows; timelines at p = 4, m = 8
        runs.append(("pipe", "lab03_pp_naive", p, pipe))
        for m in z["micro"]:
            for s in PIPE_SCHEDULES:
                if schedule_runs(s, p, m):
                    runs.append(("pipe", "lab04_1f1b", p, f"{pipe} --micro-batches {m} --schedule {s}"))
    std = f"{z['std']} --batch {z['batch']} --steps {z['std_steps']}"
    runs += [  # charts 3 to 6: every lab and layout, one model, one global batch
        ("std", "lab01_dp", 1, std),  # the one-rank baseline
        ("std", "lab01_dp", 2, std),
        ("std", "lab01_dp", 4, std),
        ("std", "lab02_zero", 4, f"{std} --zero-stage 1"),
        ("std", "lab02_zero", 4, f"{std} --zero-stage 2"),
        ("std", "lab02_zero", 4, f"{std} --zero-stage 3"),
        ("std", "lab03_pp_naive", 2, std),
        ("std", "lab03_pp_naive", 4, std),
        ("std", "lab04_1f1b", 2, f"{std} --micro-batches 8 --schedule 1f1b"),
        ("std", "lab04_1f1b", 4, f"{std} --micro-batches 8 --schedule gpipe"),
        ("std", "lab04_1f1b", 4, f"{std} --micro-batches 8 --schedule 1f1b"),
        ("std", "lab05_tp", 2, std),
        ("std", "lab05_tp", 4, std),
        ("std", "lab06_3d", 4, f"{std} --tp 2 --pp 2 --dp 1"),
        ("std", "lab06_3d", 4, f"{std} --tp 1 --pp 2 --dp 2"),
        ("std", "lab07_cp", 4, std),  # the ring, zig-zag
        ("std", "lab07_cp", 4, f"{std} --cp-algo ulysses"),
        ("std", "lab08_ep", 4, std),  # 4 experts, top-2: another model, left out of the loss chart
    ]
    # the bf16 chart: lab01 -n 1 in fp32 and in bf16 (--precision), the same model and tokens
    runs += [("prec", "lab01_dp", 1, std), ("prec", "lab01_dp", 1, f"{std} --precision bf16")]
    # chart 3b: the global batch fixed, then the micro-batch size fixed (one step measures memory)
    seen = set()
    for m in z["acts_micro"]:
        for s in ("gpipe", "1f1b"):
            for batch in (z["batch"], z["acts_rows"] * m):
                flags = f"{z['std']} --batch {batch} --steps 1 --micro-batches {m} --schedule {s}"
                if flags not in seen:
                    seen.add(flags)
                    runs.append(("acts", "lab04_1f1b", 4, flags))
    # chart 3c: lab05's activations per rank by kind, TP x SP x --recompute (one step measures memory)
    for t in (1, 2, 4):
        for sp in ((False,) if t == 1 else (False, True)):
            for mode in ("none", "selective", "full"):
                runs.append(("sp", "lab05_tp", t, f"{z['sp']} --recompute {mode}" + (" --sequence-parallel" if sp else "")))
    # chart 3d: lab07 as T grows at CP = 1, 2, 4 (zig-zag ring); contiguous at the longest T for the imbalance
    for T in z["cp_seq"]:
        for n in (1, 2, 4):
            runs.append(("cp", "lab07_cp", n, f"{z['cp']} --seq {T}"))
    runs.append(("cp", "lab07_cp", 4, f"{z['cp']} --seq {z['cp_seq'][-1]} --cp-layout contiguous"))
    # chart 3e: lab08, the busiest expert over the steps at three aux-loss weights; the all-to-all at EP = 1, 2, 4
    for aux in (0, 0.01, 0.1):
        runs.append(("ep", "lab08_ep", 4, f"{z['ep']} --steps {z['ep_steps'][1]} --aux-loss-coef {aux}"))
    for n in (1, 2, 4):
        runs.append(("ep", "lab08_ep", n, f"{z['ep']} --steps {z['ep_steps'][0]}"))
    # chart 3f: load balance by the aux loss against DeepSeek-V3's bias (lab08 part 3), one rank
    for routing in ROUTINGS:
        runs.append(("route", "lab01_dp", 1, f"{z['route']} --experts 4 {routing}"))
    return runs


def estimate(flags, ranks):
    """Rough seconds of a run: start-up plus 72 d^2 L FLOP per token and step at ~40 GFLOP/s a core."""
    a = shlex.split(flags)
    v = {k: int(a[a.index(k) + 1]) for k in ("--layers", "--d-model", "--seq", "--batch", "--steps") if k in a}
    flop = 72.0 * v["--d-model"] ** 2 * v["--layers"] * v["--seq"] * v["--batch"] * (v["--steps"] + 0.5)
    return 0.5 + flop / 40e9 / min(ranks, CORES)


def clock(s):
    return f"{int(s) // 60}:{int(s) % 60:02d}"


def run_sweep(runs, build, out, mpirun):
    """Run the table, printing progress; returns the commands per group (as run from the charts folder)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    todo = [r for r in runs if os.path.exists(os.path.join(build, r[1]))]
    for r in runs:
        if r not in todo:
            print(f"skipped (not built): {r[1]} -n {r[2]} {r[3]}", flush=True)
    est = [estimate(r[3], r[2]) for r in todo]
    t0, done_est, commands = time.time(), 0.0, {}
    for i, (group, lab, n, flags) in enumerate(todo):
        gdir = os.path.join(out, "runs", group)
        os.makedirs(gdir, exist_ok=True)
        elapsed = time.time() - t0
        left = (elapsed / done_est if done_est else 1.0) * sum(est[i:])
        shown = f"mpirun -n {n} {os.path.relpath(os.path.join(build, lab), out)} {flags} --out runs/{group}"
        commands.setdefault(group, []).append(shown)
        print(f"[run {i + 1:2d} of {len(todo)}] {clock(elapsed)} elapsed, ~{clock(left)} left | {shown}", flush=True)
        cmd = [mpirun, "-n", str(n), os.path.join(build, lab), *shlex.split(flags), "--out", gdir]
        log = os.path.join(gdir, f"{i + 1:02d}_{lab}.log")
        with open(log, "w") as f:
            try:
                p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=300)
                status = p.returncode
            except subprocess.TimeoutExpired:
                status = "timeout (300 s)"
        if status != 0:
            print(f"error: run failed ({status}): {' '.join(cmd)}\n--- {log} ---", file=sys.stderr)
            print(open(log).read()[-3000:], file=sys.stderr)
            sys.exit(1)
        done_est += est[i]
    print(f"sweep: {len(todo)} runs in {clock(time.time() - t0)}", flush=True)
    return commands, time.time() - t0


# ---- the timeline table: busy, communication and idle per rank in the drawn step ----

def timeline_table(files, names, path):
    rows = []
    for f, name in zip(files, names):
        ev = []
        with open(f) as fh:
            next(fh)
            for line in fh:
                r, s, e, op, kind, mb, step = line.rstrip("\n").split(",")
                ev.append((int(r), float(s), float(e), kind, int(step)))
        last = max(x[4] for x in ev)
        ev = [x for x in ev if x[4] == last]
        t0, t1 = min(x[1] for x in ev), max(x[2] for x in ev)
        for r in sorted({x[0] for x in ev}):
            def union(kinds):
                spans = sorted((x[1], x[2]) for x in ev if x[0] == r and x[3] in kinds)
                total, end = 0.0, -1e300
                for s, e in spans:
                    if e > end:
                        total += e - max(s, end)
                        end = e
                return total
            busy, anything = union({"compute"}), union({"compute", "comm"})
            rows.append((name, last, r, (t1 - t0) / 1e3, busy / 1e3, (anything - busy) / 1e3,
                         (t1 - t0 - anything) / 1e3, 1 - busy / (t1 - t0)))
    records_to_tsv.write_tsv(path, {"subtitle": "per rank, in the drawn step"},
                             ["schedule", "step", "rank", "step_ms", "compute_ms", "comm_only_ms", "idle_ms",
                              "bubble_this_step"], rows)


# ---- the planner's chart: one model's layouts on a cluster (plan3d --json) ----

# --cp 1: the chart is lab06's three dimensions, TP x PP with DP the rest (plan3d also searches CP)
PLAN_ARGS = ["--model", "llama3-70b", "--cluster", "h100", "--gpus", "64", "--global-batch", "512", "--cp", "1"]


def plan_table(build, path, args=PLAN_ARGS):
    """plan3d's estimates for one model: the best layout of each (tp, pp) up to pp 16, as a TSV.
    Returns the command that made them, or None where plan3d is not built."""
    exe = os.path.join(build, "plan3d")
    if not os.path.exists(exe):
        return None
    js = path + ".json"
    cmd = [exe, *args, "--json", js]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    import json
    t = json.load(open(js))
    best = {}
    for x in t["layouts"]:  # best first: the first of each (tp, pp) is its best
        if x["pp"] <= 16:
            best.setdefault((x["tp"], x["pp"]), x)
    gib = 2.0 ** 30
    cats = ("params", "grads", "optim", "acts", "comm", "workspace")
    parts = ("compute_s", "tp_s", "pp_s", "bubble_s", "dp_s", "optimizer_s")
    with open(path, "w") as f:
        m, c = t["model"], t["cluster"]
        f.write(f"# subtitle: {m['name']} ({m['params'] / 1e9:.1f}B) on {c['gpus']} x {c['name']}, global batch "
                f"{t['training']['global_batch']}, {t['training']['precision']}, ZeRO-{t['training']['zero_stage']}\n")
        f.write(f"# limit_gib: {t['layouts'][0]['mem_limit_bytes'] / gib:.3f}\n# mem_gib: {c['mem_gib']}\n")
        f.write("\t".join(("layout", "tp", "pp", "dp", "fits", "winner", "step_s") + parts
                          + tuple(k + "_gib" for k in cats) + ("total_gib", "schedule")) + "\n")
        for (tp, pp), x in sorted(best.items()):
            label = f"t{tp} p{pp} d{x['dp']}"
            row = [label, tp, pp, x["dp"], int(x["fits"]), int(x["winner"]), f"{x['step_s']:.4g}"]
            row += [f"{x[k]:.4g}" for k in parts] + [f"{x['mem_bytes'][k] / gib:.4g}" for k in cats]
            row += [f"{x['mem_total_bytes'] / gib:.4g}", x["label"].split(" ", 5)[-1]]
            f.write("\t".join(str(v) for v in row) + "\n")
    os.remove(js)
    return os.path.relpath(exe, os.path.dirname(os.path.abspath(path))) + " " + " ".join(args) + " --json plan.json"


# ---- the charts ----

def schedules_table(build, mpirun, path, p=4, m=8):
    """lab04's own lists (--print-schedule) of every schedule at p, m, run at unit times by
    schedule_gantt.py: the ideal Gantt charts. Returns the command, as a user would type it."""
    text = ""
    for s in PIPE_SCHEDULES:
        cmd = [mpirun, "-n", str(p), os.path.join(build, "lab04_1f1b"), "--print-schedule", "--micro-batches", str(m),
               "--schedule", s]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        if r.returncode != 0:
            sys.exit(f"error: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr}")
        text += r.stdout
    r = subprocess.run([sys.executable, os.path.join(HERE, "schedule_gantt.py")], input=text, capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        sys.exit(f"error: schedule_gantt.py: {r.stderr}")
    with open(path, "w") as f:
        f.write(r.stdout)
    return (f"(for s in {' '.join(PIPE_SCHEDULES)}; do mpirun -n {p} ./lab04_1f1b --print-schedule --micro-batches {m} "
            f"--schedule $s; done) | python3 ../plots/schedule_gantt.py > {path}    # from build/")


def chart_list(pipe_recs, note):
    """(name, title, script, gnuplot variables, table file, group, what to look at)"""
    p4m8 = {}
    for r in pipe_recs:
        if r["ranks"] == 4 and (r["lab"] == "lab03_pp_naive" or r.get("micro_batches") == 8):
            p4m8[r.get("schedule", "naive")] = os.path.relpath(r["timeline"], ".")
    order = [s for s in ("naive",) + PIPE_SCHEDULES if s in p4m8]
    files = " ".join(p4m8[s] for s in order)
    titles = " ".join(f"'{SCHEDULE_TITLES[s]}'" for s in order)
    over = note or "each rank had a core"
    return [
        ("bubble", "Bubble fraction against micro-batches", "bubble.gp", {"src": "bubble.tsv"}, "bubble.tsv", "pipe",
         "Measured bubble (1 - busy/wall per rank: points at the mean over ranks, bars from min to max) of the naive "
         "pipeline (lab03) and of lab04's schedules beside the textbook theory on unit times (lines): (p-1)/p, "
         "(p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(vm+p-1) interleaved (v = 2), (p-1)/(3m+p-1) ZB-H1, "
         "(p-1)/(6m+p-1) ZB-V; small open markers: each schedule's formula on the run's own measured t_F, t_B, t_W "
         "(on a CPU the backward takes about twice the forward, so the zero-bubble points sit above their unit-time "
         "lines). GPipe and 1F1B have the same bubble; micro-batches shrink it, interleaving by v, the split backward "
         f"by up to 3 and 6. {over}. Compare with the theory at p = 2."),
        ("timeline", "Pipeline timelines per rank, p = 4, m = 8", "timeline.gp",
         {"src": files, "names": titles, "note": note}, "timeline.tsv", "pipe",
         "One step (the last) of each schedule, every rank a row: forward (F<micro-batch>), backward (B<micro-batch>: "
         "the whole backward, or its input half where the schedule splits it), weight half (W<micro-batch>), "
         "other compute (embedding, head, optimizer), communication (sends, receives, waits) and idle. "
         "Naive: one stage at a time; GPipe: all forwards then all backwards; 1F1B: one forward, one backward; "
         "interleaved: two chunks per rank, so twice the (shorter) steps; ZB-H1 and ZB-V: W's fill the drain. "
         f"{over}."),
        ("memory", "Memory per rank by category: DP against ZeRO-1/2/3", "memory.gp", {"src": "memory.tsv"},
         "memory.tsv", "std",
         "Peak bytes of rank 0 by category, counted by the allocator. The black line on each bar is the formula of "
         "the model states (parameters + gradients + AdamW moments, fp32): 16Ψ for DP, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N and "
         "16Ψ/N for ZeRO-1/2/3; the measured states sit on it plus the lab's named buffers (a gradient bucket, the "
         "gathered unit). Activations do not shrink: ZeRO shards the model states only."),
        ("acts", "Activation memory of GPipe against 1F1B as m grows", "acts.gp", {"src": "acts.tsv"}, "acts.tsv", "acts",
         "Peak activation bytes of the busiest stage (points, measured by the allocator) and the schedule's formula "
         "(lines: GPipe m micro-batches, 1F1B min(m, p-r)). Left: the global batch fixed, so GPipe always holds the "
         "whole batch while 1F1B's peak falls; right: the micro-batch size fixed, so GPipe grows with m and 1F1B "
         "stops at p micro-batches."),
        ("spacts", "Activation memory per rank: TP, SP and recomputation", "spacts.gp", {"src": "spacts.tsv"},
         "spacts.tsv", "sp",
         "lab05's peak activation bytes per rank (one step, one micro-batch), stacked by kind as the allocator lays "
         "the block out: the layers' attention matrices att [B,H/t,T,T] (the term that grows with T^2), the layers' "
         "other pieces (linear in T) and what is not per layer (the layer input x_in, the tokens, the head's logits "
         "and probabilities); the black points are theory.h's formula, which the bars meet exactly. TP divides the "
         "T^2 term and the heads' and MLP's pieces by t; SP also the residual stream, LayerNorm statistics and the "
         "head's (the all-gathered LayerNorm outputs stay whole); selective drops att; full keeps one [B,T/t,C] per "
         "layer. The recomputation's one-layer set is the workspace's, not in these bars. Korthikanti et al. 2022's "
         "Table 2, measured on this model (lab05_tp/part2-sequence-parallel.md)."),
        ("cpseq", "Long sequences: context parallelism per rank as T grows", "cpseq.gp", {"src": "cpseq.tsv"},
         "cpseq.tsv", "cp",
         "lab07_cp (ring, zig-zag) at CP = 1, 2, 4 on a tiny model as the sequence T grows. Left: the activation peak "
         "per rank (points: the allocator; lines: theory/context.c's th_cp_acts_bytes, which they meet exactly): every "
         "piece is per position, so CP = N divides it by N at every T, and the longest T that fits a memory cap grows "
         "N-fold. Middle: the median step time. Right: each rank's attention kernel time per step (forward and "
         "backward blocks; on a CPU the thread's CPU time) at CP = 4 and the longest T: contiguous chunks leave the "
         "last rank 7 times the first one's causal scores (1:3:5:7), zig-zag gives every rank the same scores, and "
         "the same time once a chunk spans whole key tiles (the CPU kernel skips a 32 x 128 tile only when all of it "
         "is masked: at T/N = 64 rank r still computes r + 5 tiles). Times are measured on a shared CPU "
         f"{'with more ranks than the ' + str(CORES) + ' cores' if CORES < 4 else ''}: compare within one run."),
        ("epload", "Expert parallelism: the experts' load and the all-to-all", "epload.gp", {"src": "epload.tsv"},
         "epload.tsv", "ep",
         "lab08_ep (E = 4, top-2, no capacity) on a tiny model. Left: the busiest expert's tokens in each step (any "
         "rank's expert, any layer) over the uniform mean k N_tok / E, at -n 4 with Switch's load-balancing loss "
         "weighted 0, 0.01 and 0.1: the all-to-all and the busiest rank's matmuls are sized by this ratio, not by "
         "the mean. Middle: the bytes that left rank 0 per step (points: the routing's exact count, which comm's "
         "counter meets, above the line where rank 0's tokens chose other ranks' experts more than (N-1)/N of the "
         "time; line: uniform routing's 4 k N_tok C b (N-1)/N x L) at EP = 1, 2, 4 with the global batch "
         "fixed: N_tok falls as 1/N while (N-1)/N grows. Right: rank 0's all-to-all time (waiting for the slowest "
         "rank included) and its experts' matmul time per step. Times are measured on a shared CPU"
         f"{' with more ranks than the ' + str(CORES) + ' cores' if CORES < 4 else ''}: compare within one run."),
        ("balance", "Balancing the experts: the aux loss against DeepSeek-V3's bias", "balance.gp",
         {"src": "balance.tsv"}, "balance.tsv", "route",
         "lab01_dp -n 1 with 4 experts, top-2, no capacity, at five routings (lab08_ep/part3-deepseek-routing.md): "
         "softmax or sigmoid scores, balanced by Switch's aux loss (a = 0.01) or by DeepSeek-V3's per-expert bias "
         "(no aux loss) moving by gamma each step. Left: the worst layer's max/mean choices per expert in each "
         "step (1 is perfect balance). Right: each run's loss less the softmax aux-loss run's (Switch's routing; "
         "the aux runs' losses include their aux term, about 0.01). One seed and few steps: gamma 0.001 moves a "
         "bias by at most 0.05 in 50 steps, too little for the deepest layer."),
        ("throughput", "Throughput of every lab and layout", "throughput.gp", {"src": "throughput.tsv"},
         "throughput.tsv", "std",
         "Tokens per second (median step after the first), every lab and layout at the same model and global batch; "
         f"the dashed line is the one-rank baseline. {'Runs with more ranks than the ' + str(CORES) + ' cores share them.' if CORES < 4 else ''}"),
        ("loss", "Loss curves of every lab and layout", "loss.gp", {"src": "loss.tsv"}, "loss.tsv", "std",
         "Top: the loss of every step, every run on top of the one-rank baseline (lab01 -n 1). Bottom: the relative "
         "difference from the baseline; the tests require it below 1e-5. Every layout trains on the same tokens."),
        ("precision", "bf16 against fp32: the loss of lab01 -n 1", "precision.gp", {"src": "precision.tsv"},
         "precision.tsv", "prec",
         "Top: the loss of every step of lab01 -n 1 in fp32 (the baseline) and with --precision bf16 (bf16 weights, "
         "activations and gradients; fp32 master weights, AdamW moments and arithmetic), on the same tokens. "
         "Bottom: the relative difference; the tests require it below 2 % at every step (dashed) and 1 % at the "
         "last. bf16 keeps about 3 significant digits, so the curves part by about 1e-3, not the 1e-7 of a layout."),
        ("plan", "plan3d: step time and memory per GPU of Llama-3-70B's layouts on 64 H100s", "plan.gp",
         {"src": "plan.tsv"}, "plan.tsv", "plan",
         "plan3d's estimates (lab09_5d/part3-planning.md), no run: for each TP x PP (DP the rest) "
         "the best micro-batch, schedule, SP and recomputation. Top: the step time by part (compute at the preset's "
         "efficiency, exposed TP, PP and DP traffic, the bubble, the optimizer); layouts that do not fit have no bar. "
         "Bottom: memory per GPU by category (the fullest stage) against the usable memory; the winner is marked. "
         "The memory formulas are theory/'s, the ones --check holds to the byte against the labs."),
        ("schedules", "Every pipeline schedule at unit times, from lab04's own lists", "schedules.gp",
         {"src": "schedules.tsv"}, "schedules.tsv", "sched",
         "The ideal timeline (Gantt) of each lab04 schedule at p = 4, m = 8: each rank runs the list "
         "`lab04_1f1b --print-schedule` prints, in order, a forward taking 1 unit, a backward 2 (or an input half 1 "
         "and a weight half 1 where split), a chunk's action 1/v of that, sends free; an action waits only for what "
         "it needs (the previous stage's forward, the next stage's backward). The makespan of each panel is the one "
         "--print-schedule prints (plots/schedule_gantt.py checks it), and its idle share is the bubble both ways: of "
         "the step, (p-1)/(m+p-1) for GPipe and 1F1B, and of the ideal step, the papers' (p-1)/m. Beside it the "
         "measured timeline chart shows the same lists on real kernels."),
        ("comm", "Bytes a rank sends per step, and the link each technique needs", "comm.gp", {"src": "comm.tsv"},
         "comm.tsv", "std",
         "What a rank sends per step (the ring traffic of its collectives, the payload of its sends; it receives as "
         "much), the maximum over ranks, coloured by the link the technique needs: DP and ZeRO any link (one step's "
         "gradient, overlapping the backward), pipelines the network between hosts (point to point, travelling while "
         "other micro-batches compute), TP the fastest, inside a host (blocking, in every layer), 3D each group on "
         "its own, CP and EP a fast one (inside every layer; CP's ring overlaps attention, EP's all-to-alls block). "
         "The label is the collective calls per step, each a wait. Every bar equals the lab's formula "
         "(the tests check it; the table keeps both), lab08's all-to-all the routing's exact count. Runs on one "
         "rank move nothing and are left out."),
    ]


def gnuplot(script, variables, fmt, cwd):
    """Run one chart's script; returns (the command as a user would type it, the result)."""
    assigns = "; ".join(f"{k}={gp_string(v)}" for k, v in {**variables, "fmt": fmt}.items())
    p = subprocess.run(["gnuplot", "-e", assigns, os.path.join(HERE, script)], cwd=cwd, capture_output=True, text=True)
    shell = shlex.quote(assigns) if "'" not in assigns else \
        '"' + "".join("\\" + c if c in '"$`\\' else c for c in assigns) + '"'
    return f"gnuplot -e {shell} {os.path.join(HERE, script)}", p


def gp_string(v):
    """A gnuplot string constant: single quotes unless the value holds one."""
    v = str(v)
    return f"'{v}'" if "'" not in v else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def md_table(path, max_rows=40):
    lines = [l.rstrip("\n") for l in open(path) if not l.startswith("#")]
    header, rows = lines[0].split("\t"), [l.split("\t") for l in lines[1:]]

    def cell(x):
        try:
            v = float(x)
        except ValueError:
            return x
        if v != v:
            return "n/a"
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}" if abs(v) >= 1e4 else str(int(v))
        return f"{v:.6g}" if abs(v) < 1e4 else f"{v:,.0f}"
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows[:max_rows]]
    if len(rows) > max_rows:
        out.append(f"\n({len(rows) - max_rows} more rows in `{os.path.basename(path)}`)")
    return "\n".join(out)


def copy_to_docs(charts, docs, mode, pipe_recs):
    """The PNG of every chart into the lessons' folder, with a README.md that says
    what each shows and how to redraw it (the numbers stay in the build's index.md)."""
    os.makedirs(docs, exist_ok=True)
    lines = ["# Charts of the lessons\n",
             "Drawn by `make plots` (from `build/`), which runs the sweep of `plots/make_charts.py`, draws "
             "every chart into `build/charts/` (with `index.md`: the numbers and the commands behind each) and "
             "copies the PNGs here. Timing figures (throughput, bubbles, timelines) are the drawing machine's: "
             f"{CORES} cores, device `{pipe_recs[0]['device'] if pipe_recs else '?'}`"
             f"{', quick sweep (tiny model)' if mode == 'quick' else ''}. "
             "Bytes, memory and losses are exact.\n"]
    for name, title, script, variables, table, group, what in charts:
        shutil.copyfile(f"{name}.png", os.path.join(docs, f"{name}.png"))
        lines.append(f"## {title}\n\n![{title}]({name}.png)\n\n{what}\n")
    with open(os.path.join(docs, "README.md"), "w") as f:
        f.write("\n".join(lines))
    print(f"lesson charts: {len(charts)} PNGs and README.md in {docs}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="folder with the lab programs [build]")
    ap.add_argument("--out", help="charts folder [BUILD/charts]")
    ap.add_argument("--docs", help="also copy the PNGs there, with a README.md (the lessons' images)")
    ap.add_argument("--quick", action="store_true", help="tiny model, few runs: checks the plumbing (the test)")
    ap.add_argument("--mpirun", default=os.environ.get("MPIRUN", "mpirun"))
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    out = os.path.abspath(a.out or os.path.join(build, "charts"))
    docs = os.path.abspath(a.docs) if a.docs else None
    if not os.path.exists(os.path.join(build, "lab01_dp")):
        sys.exit(f"error: --build {a.build}: no lab01_dp there (build the labs first: cmake --build {a.build})")
    if not shutil.which("gnuplot"):
        sys.exit("error: gnuplot not found (apt-get install gnuplot-nox)")
    mode = "quick" if a.quick else "full"
    z = SIZES[mode]
    shutil.rmtree(os.path.join(out, "runs"), ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    os.chdir(out)  # every path below, and in index.md, is relative to the charts folder

    t_start, load_before = time.time(), os.getloadavg()[0]
    runs = sweep(z)
    print(f"sweep ({mode}): {len(runs)} runs into {out}/runs, {CORES} cores", flush=True)
    commands, sweep_s = run_sweep(runs, build, out, a.mpirun)

    try:
        pipe_recs = records_to_tsv.read_records([os.path.join("runs", "pipe", "records.jsonl")])
        on_cpu = any(r["device"] == "cpu" for r in pipe_recs)
        note = f"p = 4 ran 4 ranks on {CORES} cores (oversubscribed): its measured bubble can sit above the theory" \
            if on_cpu and CORES < 4 else ""
        for group, only in (("pipe", ("bubble",)), ("std", ("memory", "throughput", "loss", "comm")),
                            ("acts", ("acts",)), ("sp", ("spacts",)), ("prec", ("precision",)), ("cp", ("cpseq",)),
                            ("ep", ("epload",)), ("route", ("balance",))):
            path = os.path.join("runs", group, "records.jsonl")
            if os.path.exists(path):
                records_to_tsv.convert([path], ".", note if group == "pipe" else "", only)
    except records_to_tsv.RecordsError as e:  # the sweep's own records: a run that stopped half-way
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    plan_cmd = plan_table(build, "plan.tsv")
    if plan_cmd:
        commands["plan"] = [plan_cmd]
    commands["sched"] = [schedules_table(build, a.mpirun, "schedules.tsv")]
    charts = [c for c in chart_list(pipe_recs, note) if c[0] != "plan" or plan_cmd]
    tl = charts[1][3]
    timeline_table(tl["src"].split(), [w.strip("'") for w in shlex.split(tl["names"])], "timeline.tsv")

    problems, sections = [], []
    for name, title, script, variables, table, group, what in charts:
        variables = {**variables, "out": name}
        for fmt in ("png", "svg"):
            shown_fmt, p = gnuplot(script, variables, fmt, out)
            target = f"{name}.{fmt}"
            if p.returncode != 0 or p.stderr.strip():
                problems.append(f"{target}: gnuplot {'status ' + str(p.returncode) if p.returncode else 'said'}:\n{p.stderr.strip()}")
            elif not os.path.exists(target) or os.path.getsize(target) == 0:
                problems.append(f"{target}: not written")
            if fmt == "png":
                shown = shown_fmt + "    # fmt='svg' for the SVG"
        print(f"chart {name}: {name}.png, {name}.svg", flush=True)
        sections.append(f"## {len(sections) + 1}. {title}\n\n![{title}]({name}.png)\n\n"
                        f"[{name}.svg]({name}.svg) · data: [`{table}`]({table})\n\n{what}\n\n"
                        f"{md_table(table)}\n\nDrawn (in this folder) by\n\n```\n{shown}\n```\n\n"
                        + ("from the estimates of\n\n```\n" if group == "plan" else
                           "from lab04's lists, by\n\n```\n" if group == "sched" else
                           "from the runs (from this folder, with `OPENBLAS_NUM_THREADS=1`)\n\n```\n")
                        + "\n".join(commands.get(group, [])) + "\n```\n")
    with open("gnuplot.log", "w") as f:
        f.write("\n\n".join(problems))
    total = time.time() - t_start
    with open("index.md", "w") as f:
        load_after = os.getloadavg()[0]
        busy = " (more than the cores: other programs shared them and slowed some runs, so times and tok/s are " \
            "noisier)" if max(load_before, load_after) > CORES else ""
        f.write(f"# parallel-labs charts\n\nMade by `python3 plots/make_charts.py {shlex.join(sys.argv[1:])}`"
                f": {sum(len(c) for c in commands.values())} runs in {clock(sweep_s)}, "
                f"{clock(total)} in all, on {CORES} cores, device `{pipe_recs[0]['device'] if pipe_recs else '?'}`; "
                f"load average {load_before:.1f} before the sweep, {load_after:.1f} after{busy}. Each chart's numbers "
                f"are the TSV beside it (from the run records in `runs/*/records.jsonl`); `plots/README.md` says how "
                f"to draw one chart from your own records.\n\n")
        if note:
            f.write(f"Note: {note}; the ranks take turns on the cores, and a rank waiting for one that waits for "
                    f"a core counts that as bubble. The comparison with the theory is the p = 2 panel.\n\n")
        f.write("\n".join(sections))
    print(f"index: {out}/index.md", flush=True)
    if docs:
        copy_to_docs(charts, docs, mode, pipe_recs)
    print(f"done in {clock(total)} ({clock(sweep_s)} of runs)", flush=True)
    if problems:
        print("gnuplot problems (also in gnuplot.log):\n" + "\n".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
