"""lab04_1f1b against its promises: every schedule, stage count, micro-batch
count and chunk count reproduces lab01's one-rank losses; the printed lists
pass a checker that knows only the rules (every action once, its inputs before
it, the textbook bubble on unit times); each rank runs its actions in the
printed order (read from the timeline it wrote, not from its own plan); each
rank's activation peak, measured by the allocator, is the schedule's formula.
Bad input is tests/test_bad_input.py's.

--recompute: every mode under 1F1B (and the split backward of ZB-H1, where
full recomputation hands W what it reads) gives the --recompute none losses
bit for bit, and each rank's peak is its blocks in flight x the formula.

--experts: gpipe, 1f1b and interleaved at p = 2 and 3 reproduce lab01's
one-rank MoE run (tests/test_lab03.py's check); zb-h1 and zb-v refuse it.

usage: test_lab04.py equivalence|schedules|order|recompute|experts|cuda"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import (MPIRUN, acts_bytes, check, check_acts, compare_runs, program, run,  # noqa: E402
                     skip_without_gpu)
from test_lab03 import (BASE, MOE, MOE_ROUTINGS, check_experts_match, check_pipeline_record,  # noqa: E402
                        read_timeline)  # the same model as lab03's tests

LAB = "lab04_1f1b"
# Eight layers split into chunks at p = 4; an odd one (T = 13, 3 heads of 8, 6
# layers) for uneven shapes. lab01 gets the same flags.
SMALL = ["--steps", "20", "--layers", "8", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "16"]
ODD = ["--steps", "20", "--layers", "6", "--d-model", "24", "--heads", "3", "--seq", "13", "--batch", "12"]


# ---- an independent checker of the printed lists ------------------------------------

TEXTBOOK = {  # the unit-time bubble (t_F = t_B = t_W) the literature gives each schedule
    "gpipe": lambda p, m, v: (p - 1) / (m + p - 1),
    "1f1b": lambda p, m, v: (p - 1) / (m + p - 1),
    "interleaved": lambda p, m, v: (p - 1) / (v * m + p - 1),   # Narayanan et al. 2021: /v
    "zb-h1": lambda p, m, v: (p - 1) / (3 * m + p - 1),         # Qi et al. 2024: (p-1)(tF+tB-tW)
    "zb-v": lambda p, m, v: (p - 1) / (6 * m + p - 1),          # (p-1) tF/2, half a chunk's start-up
}


def stage_of(name, p, rank, chunk):
    """The placement the lesson states: Megatron's chunk c p + r; the V's r, 2p-1-r."""
    if name == "zb-v":
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


def print_schedule(p, schedule, m, extra=()):
    """`mpirun -n p lab04 --print-schedule ...`, parsed: the header's numbers and
    per rank its stages and actions (op, micro-batch, chunk)."""
    cmd = [MPIRUN, "-n", str(p), program(LAB), "--print-schedule", "--schedule", schedule,
           "--micro-batches", str(m), "--batch", str(2 * m), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    check(out.returncode == 0, f"{' '.join(cmd)}: status {out.returncode}: {out.stderr}")
    lines = out.stdout.splitlines()
    h = re.match(r"schedule (\S+): (\d+) ranks x (\d+) chunks? \((\d+) virtual stages\), (\d+) micro-batches, (.*)", lines[0])
    check(h is not None, f"header: {lines[0]!r}")
    sch = {"name": h[1], "p": int(h[2]), "v": int(h[3]), "S": int(h[4]), "m": int(h[5]),
           "split": h[6].startswith("backward split"), "stages": [], "actions": [], "text": out.stdout}
    check((sch["name"], sch["p"], sch["m"]) == (schedule, p, m) and sch["S"] == p * sch["v"], f"header {lines[0]!r}")
    for r in range(p):
        x = re.match(rf"rank {r} \(stages? ([\d ]+)\): (.*)", lines[1 + r])
        check(x is not None, f"rank line {lines[1 + r]!r}")
        sch["stages"].append([int(s) for s in x[1].split()])
        acts = []
        for tok in x[2].split():
            a = re.fullmatch(r"([FBW])(\d+)(?:\.(\d+))?", tok)
            check(a is not None and (a[3] is not None) == (sch["v"] > 1), f"rank {r}: token {tok!r}")
            acts.append((a[1], int(a[2]), int(a[3] or 0)))
        sch["actions"].append(acts)
    sch["unit_line"] = lines[1 + p]
    sch["flight_line"] = lines[2 + p]
    return sch


def check_lists(sch):
    """Placement as documented; every F and B (and W where split) of every
    micro-batch on every virtual stage exactly once."""
    p, v, m, name = sch["p"], sch["v"], sch["m"], sch["name"]
    for r in range(p):
        check(sch["stages"][r] == [stage_of(name, p, r, c) for c in range(v)], f"{name}: rank {r} holds {sch['stages'][r]}")
    seen = {}
    for r in range(p):
        for op, mb, c in sch["actions"][r]:
            key = (op, mb, stage_of(name, p, r, c))
            check(key not in seen, f"{name}: {key} twice")
            seen[key] = r
    ops = "FBW" if sch["split"] else "FB"
    want = {(op, mb, s) for op in ops for mb in range(m) for s in range(p * v)}
    check(set(seen) == want, f"{name}: missing {sorted(want - set(seen))[:5]}, extra {sorted(set(seen) - want)[:5]}")


def simulate(sch, tf=1.0, tb=1.0, tw=1.0):
    """Each rank runs its list in order; F(mb, s) needs F(mb, s-1), B(mb, s)
    needs its F and B(mb, s+1), W needs its B. An unsplit B takes tB + tW; a
    chunk's action 1/v of a rank's. Returns the makespan; fails on a wait for ever."""
    p, v, S, name = sch["p"], sch["v"], sch["S"], sch["name"]
    dur = {"F": tf / v, "B": (tb if sch["split"] else tb + tw) / v, "W": tw / v}
    done, pos, clock = {}, [0] * p, [0.0] * p
    left = sum(len(a) for a in sch["actions"])
    while left:
        moved = False
        for r in range(p):
            while pos[r] < len(sch["actions"][r]):
                op, mb, c = sch["actions"][r][pos[r]]
                s = stage_of(name, p, r, c)
                deps = {"F": [("F", mb, s - 1)] if s > 0 else [],
                        "B": [("F", mb, s)] + ([("B", mb, s + 1)] if s < S - 1 else []),
                        "W": [("B", mb, s)]}[op]
                if any(d not in done for d in deps):
                    break
                start = max([clock[r]] + [done[d] for d in deps])
                clock[r] = done[(op, mb, s)] = start + dur[op]
                pos[r] += 1
                left -= 1
                moved = True
        check(moved, f"{name}: the lists wait for each other for ever at {pos}")
    return max(clock)


def in_flight(sch, r, c):
    """Blocks the chunk holds at its peak: activations from F to the backward
    (its W where split), weight-gradient inputs from B to W."""
    a = w = pa = pw = 0
    for op, mb, cc in sch["actions"][r]:
        if cc != c:
            continue
        a += op == "F"
        w += op == "B" and sch["split"]
        a -= op == "W" or (op == "B" and not sch["split"])
        w -= op == "W"
        pa, pw = max(pa, a), max(pw, w)
    return pa, pw


# The textbook tables for p = 4 stages, m = 8 micro-batches, one row per stage
# (GPipe: Huang et al. 2019; 1F1B: Narayanan et al. 2021, figure 4 top, here
# counted from 0). F3 is the forward of micro-batch 3, B3 its backward.
TEXTBOOK_TABLES = {
    "gpipe": ["F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7"] * 4,
    "1f1b": [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    ],
}

SCHEDULE_CASES = [  # (p, schedule, m, extra flags)
    (4, "gpipe", 8, []), (4, "1f1b", 8, []), (2, "1f1b", 1, []), (4, "1f1b", 3, []),
    (2, "interleaved", 2, []), (2, "interleaved", 6, []), (4, "interleaved", 8, ["--layers", "8"]),
    (4, "interleaved", 4, ["--layers", "8"]),  # m = p: all forwards first, as Megatron does
    (2, "interleaved", 4, ["--virtual-stages", "3", "--layers", "6"]),
    (3, "interleaved", 6, ["--virtual-stages", "2", "--layers", "6"]),
    (2, "zb-h1", 2, []), (2, "zb-h1", 8, []), (4, "zb-h1", 4, []), (4, "zb-h1", 8, []), (3, "zb-h1", 5, ["--layers", "6"]),
    (1, "zb-v", 2, []), (2, "zb-v", 3, []), (2, "zb-v", 8, []), (4, "zb-v", 7, []), (4, "zb-v", 8, []),
    (3, "zb-v", 6, ["--layers", "6"]),
]


def schedules():
    for p, name, m, extra in SCHEDULE_CASES:
        sch = print_schedule(p, name, m, extra)
        check_lists(sch)
        v = sch["v"]
        makespan = simulate(sch)
        bubble, textbook = 1 - 3 * m / makespan, TEXTBOOK[name](p, m, v)
        check(abs(bubble - textbook) < 1e-9, f"{name} p={p} m={m} v={v}: unit-time bubble {bubble} != textbook {textbook}")
        printed = re.search(r"makespan ([\d.]+),.* bubble ([\d.]+); textbook .* = ([\d.]+)", sch["unit_line"])
        check(printed and abs(float(printed[1]) - makespan) < 1e-6, f"{name}: printed {sch['unit_line']!r}, simulated {makespan}")
        flights = [[in_flight(sch, r, c) for c in range(v)] for r in range(p)]
        want = "; ".join(f"rank {r} " + ",".join(f"{a}+{w}" if sch["split"] else f"{a}" for a, w in flights[r])
                         for r in range(p))
        check(sch["flight_line"].endswith(want), f"{name}: blocks in flight printed {sch['flight_line']!r}, counted {want}")
        if name in TEXTBOOK_TABLES and (p, m) == (4, 8):
            for r in range(p):
                got = " ".join(f"{op}{mb}" for op, mb, _ in sch["actions"][r])
                check(got == TEXTBOOK_TABLES[name][r], f"{name} rank {r}:\n  printed  {got}\n  textbook {TEXTBOOK_TABLES[name][r]}")
        # the closed forms on other times (sends free): where a formula holds for any times
        for tf, tb, tw in ((1, 1.2, 0.8), (1, 1.5, 0.5), (1.3, 1, 0.9)):
            work = m * (tf + tb + tw)
            idle = {"gpipe": (p - 1) * (tf + tb + tw), "1f1b": (p - 1) * (tf + tb + tw),
                    "interleaved": (p - 1) * (tf + tb + tw) / v,
                    "zb-h1": (p - 1) * max(tf, tb, tf + tb - tw)}.get(name)
            if idle is not None:
                got = simulate(sch, tf, tb, tw)
                check(abs(got - work - idle) < 1e-9, f"{name} p={p} m={m} on ({tf},{tb},{tw}): idle {got - work}, formula {idle}")
        print(f"{name:11s} p={p} m={m:2d} v={v}: every action once, inputs first; unit-time bubble {bubble:.4f} = "
              f"textbook; blocks in flight {want}")
    print(sch["text"])


# ---- the runs -----------------------------------------------------------------------------

def check_lab04_record(rec, n, m, schedule, v=1, model=BASE):
    check(rec["micro_batches"] == m and rec["schedule"] == schedule and rec["chunks_per_rank"] == v,
          f"record says {rec['micro_batches']} {rec['schedule']} {rec['chunks_per_rank']}")
    check(abs(rec["bubble"]["theory"] - TEXTBOOK[schedule](n, m, v)) < 1e-5, f"theory {rec['bubble']['theory']}")
    # the papers' convention, idle / ideal step: (p-1)/m for GPipe and 1F1B, (p-1)/(v m) interleaved
    papers = {"gpipe": (n - 1) / m, "1f1b": (n - 1) / m, "interleaved": (n - 1) / (v * m),
              "zb-h1": (n - 1) / (3 * m), "zb-v": (n - 1) / (6 * m)}[schedule]
    check(abs(rec["bubble"]["theory_per_ideal"] - papers) < 1e-5,
          f"{schedule}: idle/ideal {rec['bubble']['theory_per_ideal']}, expected {papers}")
    layers = int(model[model.index("--layers") + 1])
    S = n * v
    q, extra = divmod(layers, S)  # stage.h: the last L % S stages one layer more
    sizes = [q + (1 if s >= S - extra else 0) for s in range(S)]
    split = [[sum(sizes[:s]), sum(sizes[:s + 1])] for s in range(S)]
    check(rec["stage_layers"] == split, f"virtual stage layers {rec['stage_layers']} != {split}")
    check(rec["chunk_stages"] == [[stage_of(schedule, n, r, c) for c in range(v)] for r in range(n)],
          f"chunk placement {rec['chunk_stages']}")
    # memory: measured by the allocator == the schedule's blocks x their bytes, every rank
    measured = rec["mem_peak_bytes_per_rank"]["acts"]
    formula = [sum(a * b + wa * wb for a, b, wa, wb in zip(*cols)) for cols in
               zip(rec["chunk_acts_in_flight_formula"], rec["chunk_acts_bytes_per_micro_batch"],
                   rec["chunk_wgrads_in_flight_formula"], rec["chunk_wgrads_bytes_per_micro_batch"])]
    check(rec["acts_peak_bytes_formula_per_rank"] == formula, f"formula bytes {rec['acts_peak_bytes_formula_per_rank']} != {formula}")
    check(measured == formula == rec["acts_peak_measured_bytes"], f"activation peaks {measured} != formula {formula}")
    # the closed forms where they exist: 1F1B min(m, p-r), GPipe m, ZB-H1 min(m, p) (+ r+1 weight-gradient inputs)
    closed = {"gpipe": lambda r: [[m, 0]], "1f1b": lambda r: [[min(m, n - r), 0]],
              "zb-h1": lambda r: [[min(m, n), min(m, r + 1)]]}.get(schedule)
    if closed:
        got = [[[a, w] for a, w in zip(ra, rw)] for ra, rw in
               zip(rec["chunk_acts_in_flight_formula"], rec["chunk_wgrads_in_flight_formula"])]
        check(got == [closed(r) for r in range(n)], f"{schedule}: blocks in flight {got}")
    # traffic: m activations and m gradients over every boundary to another rank
    links = [sum(1 for c in range(v) for nb in (-1, 1)
                 if 0 <= stage_of(schedule, n, r, c) + nb < S and
                 [rr for rr in range(n) for cc in range(v) if stage_of(schedule, n, rr, cc) == stage_of(schedule, n, r, c) + nb][0] != r)
             for r in range(n)]
    if max(links):
        check(rec["comm_calls_per_step"]["send"] == max(links) * m,
              f"sends per step {rec['comm_calls_per_step']['send']} != {max(links)} x m")
    B, T, C = (int(model[model.index(f) + 1]) for f in ("--batch", "--seq", "--d-model"))
    check(rec["comm_ring_bytes_per_step"] == rec["comm_formula_bytes_per_step"] == max(links) * 2 * B * T * C * 4,
          f"traffic {rec['comm_ring_bytes_per_step']} != formula {rec['comm_formula_bytes_per_step']} "
          f"!= {max(links)} boundaries x 2 x B T C 4")
    # the bubble formula on the measured times, as the test computes it
    tf, tb, tw = rec["t_forward_s"], rec["t_backward_s"], rec["t_weight_s"]
    if schedule in ("gpipe", "1f1b", "interleaved"):
        want = (n - 1) / ((v if schedule == "interleaved" else 1) * m + n - 1)
        check(abs(rec["bubble_formula"] - want) < 1e-5, f"{schedule}: formula {rec['bubble_formula']} != {want}")
    elif schedule == "zb-h1":
        idle = (n - 1) * max(tf, tb, tf + tb - tw)
        check(abs(rec["bubble_formula"] - idle / (idle + m * (tf + tb + tw))) < 1e-4, f"zb-h1 formula {rec['bubble_formula']}")
    check(0 <= rec["bubble_formula"] < 1 and tf > 0 and tb > 0 and (tw > 0) == (schedule in ("zb-h1", "zb-v")),
          f"{schedule}: times {tf} {tb} {tw}, formula {rec['bubble_formula']}")
    print(f"  -n {n} {schedule} m={m} v={v}: activation peaks {measured} = formula; "
          f"bubble measured {rec['bubble']['measured']}, formula on measured times {rec['bubble_formula']:.3f}")


def equivalence():
    ref, _, _ = run("lab01_dp", 1, BASE)
    layouts = [(n, m) for n in (2, 4) for m in (1, 2, 4, 8)] + [(3, 4)]  # 3 stages: an uneven split
    for n, m in layouts:
        for schedule in ("gpipe", "1f1b"):
            rec, _, _ = run(LAB, n, BASE + ["--micro-batches", str(m), "--schedule", schedule])
            compare_runs(f"lab04 -n {n} m={m} {schedule} vs lab01 -n 1", rec, ref, 1e-5)
            check_pipeline_record(rec, n, [m if schedule == "gpipe" else min(m, n - r) for r in range(n)])
            check_lab04_record(rec, n, m, schedule)
    # the newer schedules on a model with layers for every chunk, and an odd one
    for model, cases in ((SMALL, [(2, "interleaved", 2, 2), (2, "interleaved", 8, 2), (4, "interleaved", 4, 2),
                                  (4, "interleaved", 8, 2), (2, "zb-h1", 2, 1), (2, "zb-h1", 8, 1), (4, "zb-h1", 4, 1),
                                  (4, "zb-h1", 8, 1), (2, "zb-v", 4, 2), (2, "zb-v", 16, 2), (4, "zb-v", 8, 2)]),
                         (ODD, [(2, "interleaved", 2, 3), (3, "zb-h1", 3, 1), (3, "zb-v", 6, 2), (3, "1f1b", 4, 1)])):
        ref, _, _ = run("lab01_dp", 1, model)
        for n, schedule, m, v in cases:
            args = model + ["--micro-batches", str(m), "--schedule", schedule]
            if schedule == "interleaved":
                args += ["--virtual-stages", str(v)]
            rec, _, _ = run(LAB, n, args)
            compare_runs(f"lab04 -n {n} m={m} {schedule} v={v} vs lab01 -n 1", rec, ref, 1e-5)
            check_lab04_record(rec, n, m, schedule, v, model)


def recompute():
    """1F1B at p = 2, m = 4 under each --recompute mode, ZB-H1 with full, and an
    odd model at p = 3: the losses of --recompute none bit for bit, lab01's
    within 1e-5; each rank's peak = min(m, p-r) x the stage's block by the formula."""
    for model, n, m, L, C, H, T, B in ((SMALL[:2] + ["--layers", "4"] + SMALL[4:], 2, 4, 4, 32, 2, 16, 16),
                                       (ODD, 3, 4, 6, 24, 3, 13, 12)):
        ref, _, _ = run("lab01_dp", 1, model)
        modes = ("none", "selective", "full") if n == 2 else ("selective",)
        cases = [("1f1b", mode) for mode in modes] + ([("zb-h1", "none"), ("zb-h1", "full")] if n == 2 else [])
        first = {}
        for schedule, mode in cases:
            rec, _, _ = run(LAB, n, model + ["--micro-batches", str(m), "--schedule", schedule, "--recompute", mode])
            name = f"lab04 -n {n} m={m} {schedule} --recompute {mode}"
            compare_runs(f"{name} vs lab01 -n 1", rec, ref, 1e-5)
            if schedule in first:
                check(rec["losses"] == first[schedule], f"{name}: losses differ from --recompute none's")
            first.setdefault(schedule, rec["losses"])
            check_lab04_record(rec, n, m, schedule, 1, model)
            if schedule == "1f1b":
                split = [[lo, hi] for lo, hi in rec["stage_layers"]]
                want = [min(m, n - r) * acts_bytes(B // m, T, C, H, L, lo=lo, hi=hi, recompute=mode)
                        for r, (lo, hi) in enumerate(split)]
                check_acts(rec, want, name)
            else:  # blocks and weight-gradient blocks in flight x theory.h's bytes of each
                check_acts(rec, rec["acts_peak_bytes_formula_per_rank"], name)
            print(f"  {name}: activation peaks {rec['mem_peak_bytes_per_rank']['acts']} = formula")


def order():
    """Every schedule at p = 4, m = 8: each rank's forwards, backwards and weight
    halves in the timeline are its printed list, and the clock respects every
    dependency. (The timeline names the micro-batch, not the chunk: a rank's
    k-th (op, micro-batch) is matched to the list's k-th.)"""
    p, m = 4, 8
    names = {"forward": "F", "backward": "B", "backward_weight": "W"}
    for schedule in TEXTBOOK:
        sch = print_schedule(p, schedule, m)
        model = (BASE[:1] + ["3"] + BASE[2:]) if schedule in ("gpipe", "1f1b") else SMALL[:1] + ["3"] + SMALL[2:]
        rec, _, _ = run(LAB, p, model + ["--micro-batches", str(m), "--schedule", schedule])
        ranks = read_timeline(rec, 1)  # step 0 is warm-up
        check(sorted(ranks) == list(range(p)), f"{schedule}: the timeline must hold every rank")
        clock = {}  # (op, mb, virtual stage) -> (start, end)
        for r in range(p):
            ops = [e for e in ranks[r] if e[2] in names]
            seen = " ".join(f"{names[e[2]]}{e[4]}" for e in ops)
            printed = " ".join(f"{op}{mb}" for op, mb, _ in sch["actions"][r])
            check(seen == printed, f"{schedule} rank {r}:\n  timeline {seen}\n  printed  {printed}")
            for e, (op, mb, c) in zip(ops, sch["actions"][r]):
                clock[(op, mb, stage_of(schedule, p, r, c))] = (e[0], e[1])
            if sch["v"] == 1:  # every micro-batch crosses each of this rank's boundaries once each way, in order
                for op, has_peer in (("recv_act", r > 0), ("send_act", r < p - 1),
                                     ("recv_grad", r < p - 1), ("send_grad", r > 0)):
                    mbs = [e[4] for e in ranks[r] if e[2] == op]
                    check(mbs == (list(range(m)) if has_peer else []), f"{schedule} rank {r}: {op} micro-batches {mbs}")
        S = sch["S"]
        for (op, mb, s), (t0, _) in clock.items():
            deps = {"F": [("F", mb, s - 1)] if s > 0 else [],
                    "B": [("F", mb, s)] + ([("B", mb, s + 1)] if s < S - 1 else []), "W": [("B", mb, s)]}[op]
            for d in deps:
                check(t0 >= clock[d][1], f"{schedule}: {op}{mb} of stage {s} started before {d} ended")
        print(f"{schedule} p={p} m={m}: every rank's order is the printed list, and the clock respects the dependencies")
        check_lab04_record(rec, p, m, schedule, sch["v"], model)


def cuda():
    """GPU-labelled: every schedule on CUDA reproduces lab01 on the CPU, with the
    same activation peaks; skipped (77) without a GPU."""
    skip_without_gpu(LAB)
    cpu, _, _ = run("lab01_dp", 1, BASE + ["--device", "cpu"])
    for n in (2, 4):
        for schedule in ("gpipe", "1f1b", "zb-h1"):
            gpu, _, _ = run(LAB, n, BASE + ["--device", "cuda", "--micro-batches", "4", "--schedule", schedule])
            compare_runs(f"lab04 cuda -n {n} {schedule} vs lab01 cpu -n 1", gpu, cpu, 1e-3)
            check_lab04_record(gpu, n, 4, schedule)
    cpu, _, _ = run("lab01_dp", 1, SMALL + ["--device", "cpu"])
    for n, schedule, m in ((2, "interleaved", 4), (4, "interleaved", 8), (2, "zb-v", 4), (4, "zb-v", 8)):
        gpu, _, _ = run(LAB, n, SMALL + ["--device", "cuda", "--micro-batches", str(m), "--schedule", schedule])
        compare_runs(f"lab04 cuda -n {n} {schedule} vs lab01 cpu -n 1", gpu, cpu, 1e-3)
        check_lab04_record(gpu, n, m, schedule, 2, SMALL)


def experts():
    """Every schedule with experts reproduces lab01 -n 1: the fused backward's
    (gpipe, 1f1b, interleaved), and the zero-bubble ones, whose B and W split
    the experts' and the router's backward (every routing under both)."""
    layouts = [(2, ["--schedule", "1f1b", "--micro-batches", "4"]), (3, ["--schedule", "gpipe", "--micro-batches", "8"]),
               (2, ["--schedule", "interleaved", "--micro-batches", "2"]), (3, ["--schedule", "1f1b", "--micro-batches", "2"])]
    zero_bubble = [[(2, ["--schedule", "zb-h1", "--micro-batches", "4"]), (2, ["--schedule", "zb-v", "--micro-batches", "4"])],
                   [(4, ["--schedule", "zb-h1", "--micro-batches", "8"]), (2, ["--schedule", "zb-v", "--micro-batches", "8"])]]
    for i, routing in enumerate(MOE_ROUTINGS):
        ref, _, _ = run("lab01_dp", 1, MOE + routing)
        for n, layout in [layouts[i]] + zero_bubble[i % 2]:
            rec, _, _ = run(LAB, n, MOE + routing + layout)
            check_experts_match(rec, ref, f"lab04 -n {n} {' '.join(layout + routing)}")
            worst = max(abs(a - b) for a, b in zip(rec["losses"], ref["losses"]))
            print(f"lab04 -n {n} {' '.join(layout + routing)}: loss {rec['losses'][-1]:.6f}, aux "
                  f"{rec['aux_losses'][-1]:.6f}, max |loss diff| {worst:.2e} vs lab01 -n 1 (relative bound 1e-5)")


if __name__ == "__main__":
    {"equivalence": equivalence, "schedules": schedules, "order": order, "recompute": recompute, "experts": experts,
     "cuda": cuda}[sys.argv[1]]()
    print("passed")
