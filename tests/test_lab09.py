"""lab09_5d against its promises: every layout of the grid (TP x CP x PP x DP,
ZeRO-1 over the c x d replicas, ring, all-gather and Ulysses attention, zig-zag
and contiguous positions, lab04's schedules, --recompute, SP, bf16) reproduces
lab01's one-rank run, losses and the gradient norm before clipping at every
step; every group kind (TP, CP, PP, DP) moves the bytes derived here from the
shapes, on every rank, as the lab's formula says; the activation peaks and
every memory category are theory's (the dry run's prediction, rank by rank);
--eval's held-out loss is lab01's; a checkpoint crosses layouts and labs.

usage: test_lab09.py equivalence|odd|full_grid|experts|experts_tp|schedules|precision|resume|dry_run|planner"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import BF16_GRAD_NORM_RTOL, check, compare_runs, program, run  # noqa: E402
from test_lab03 import documented_split  # noqa: E402  (the layer split stage.h documents)

LAB = "lab09_5d"
L, C, H, B, T = 4, 64, 4, 8, 32
MODEL = ["--layers", str(L), "--d-model", str(C), "--heads", str(H), "--batch", str(B), "--seq", str(T)]
STEPS = ["--steps", "10"]
M = 4  # the lab's default micro-batches per replica


def layout(t, c, p, d):
    return ["--tp", str(t), "--cp", str(c), "--pp", str(p), "--dp", str(d)]


def coord(rank, t, c, p, d):
    """mesh.h: rank = tp + t (cp + c (dp + d pp))."""
    return rank % t, rank // t % c, rank // (t * c * d), rank // (t * c) % d  # (tp, cp, pp, dp)


def cp_per_layer(algo, c, block, forwards):
    """One layer's CP collectives per micro-batch on one rank, derived from lab07's
    algorithms: {kind: (calls, payload bytes)}; block = one K|V block of the rank's heads."""
    if c == 1:
        return {}
    if algo == "ring":  # K|V c-1 steps each forward; backward K|V c-1 steps and dK|dV c steps home
        sends = forwards * (c - 1) + (c - 1) + c
        return {"send": (sends, sends * block), "recv": (sends, sends * block)}
    if algo == "allgather":
        return {"allgather": (forwards + 1, (forwards + 1) * c * block), "reduce_scatter": (1, c * block)}
    # ulysses: q|k|v there and the output back each forward (4 C/t wide: 2 blocks); dO and dq|dk|dv
    return {"alltoall": (2 * (forwards + 1), 2 * (forwards + 1) * block)}


RING_FACTOR = {"send": lambda n: 1, "recv": lambda n: 1, "allgather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n}


def chunks_of(pp, p, schedule):
    """lab04's placement of the p v virtual stages: interleaved deals them round the
    ranks, zb-v goes down and back up (a V), the others one stage per rank."""
    if schedule == "interleaved":
        return [pp, pp + p]
    if schedule == "zb-v":
        return [pp, 2 * p - 1 - pp]
    return [pp]


def check_traffic(rec, t, c, p, d, algo="ring", model=(L, C, H, B, T), recompute="none", vb=4, schedule="1f1b",
                  zero=False):
    """Each group kind on every rank: measured = the lab's formula = derived here.
    --recompute full runs each forward again, TP's all-reduces too; either mode
    reruns attention, and with it CP's exchanges."""
    tp_forwards, cp_forwards = (2 if recompute == "full" else 1), (1 if recompute == "none" else 2)
    Lm, Cm, Hm, Bm, Tm = model
    rows = Bm // (d * M)
    act = vb * rows * (Tm // c) * Cm  # a TP all-reduce, a pipeline message: the rank's T/c positions
    block = vb * rows * (Tm // c) * 2 * (Cm // t)
    stages = p * len(chunks_of(0, p, schedule))
    split = documented_split(Lm, stages)
    place = {s: pp for pp in range(p) for s in chunks_of(pp, p, schedule)}
    traffic = rec["traffic_per_group"]
    check(set(traffic) == {"tp", "pp", "dp", "cp"}, f"group kinds {sorted(traffic)}")
    for r in range(t * c * p * d):
        tp, cp, pp, dp = coord(r, t, c, p, d)
        mine = chunks_of(pp, p, schedule)
        layers = sum(split[s][1] - split[s][0] for s in mine)
        # a boundary to a stage on another rank is a message each way (one on this rank is a copy)
        boundaries = sum(n in place and place[n] != pp for s in mine for n in (s - 1, s + 1))
        want = {"tp": {"allreduce": ((2 + 2 * tp_forwards) * layers * M if t > 1 else 0, act)},
                "pp": {"send": (boundaries * M, act), "recv": (boundaries * M, act)}}
        for kind, (calls, payload) in cp_per_layer(algo, c, block, cp_forwards).items():
            want.setdefault("cp", {})[kind] = (layers * M * calls, payload / calls)
        for group, kinds in want.items():
            size = {"tp": t, "pp": p, "cp": c}[group]
            calls = sum(n for n, _ in kinds.values())
            payload = sum(n * each for n, each in kinds.values())
            ring = sum(n * each * RING_FACTOR.get(k, lambda s: 2 * (s - 1) / s)(size) for k, (n, each) in kinds.items())
            g = traffic[group]
            for key, value in (("calls", calls), ("payload_bytes", payload), ("ring_bytes", ring)):
                check(abs(g[key][r] - value) < 0.5 and abs(g[key + "_formula"][r] - value) < 0.5,
                      f"{rec['layout']} rank {r} {group} {key}: measured {g[key][r]}, formula "
                      f"{g[key + '_formula'][r]}, derived {value}")
        # the gradient: one all-reduce over the c x d replicas of this (tp, pp)
        g = traffic["dp"]
        calls = (2 if zero else 1) if c * d > 1 else 0  # ZeRO-1: a reduce-scatter and an all-gather
        check(g["group_size"] == c * d and g["calls"][r] == calls == g["calls_formula"][r],
              f"{rec['layout']} rank {r}: {g['calls'][r]} gradient reductions over {g['group_size']} replicas")
    check(abs(rec["comm_ring_bytes_per_step"] - rec["comm_formula_bytes_per_step"]) <= 1,
          f"{rec['layout']}: ring traffic {rec['comm_ring_bytes_per_step']} != formula "
          f"{rec['comm_formula_bytes_per_step']}")
    mem = rec["mem_peak_bytes_per_rank"]
    check(mem["acts"] == rec["acts_peak_bytes_formula_per_rank"],
          f"{rec['layout']}: activation peaks {mem['acts']} != formula {rec['acts_peak_bytes_formula_per_rank']}")


EQUIVALENCE = [  # (t, c, p, d), extra flags, CP algorithm
    ((2, 2, 2, 1), [], "ring"),  # the default run of 8 ranks
    ((1, 2, 2, 2), ["--check-sync"], "ring"),
    ((2, 2, 1, 2), ["--zero-stage", "1", "--check-sync"], "ring"),
    ((1, 2, 2, 1), ["--cp-algo", "allgather"], "allgather"),
    ((2, 2, 1, 1), ["--cp-algo", "ulysses"], "ulysses"),
    ((2, 2, 2, 1), ["--cp-layout", "contiguous", "--recompute", "selective"], "ring"),
    ((2, 2, 2, 1), ["--recompute", "full"], "ring"),
]


SEQUENCE_PARALLEL = [  # (t, c, p, d), extra flags: lab05's SP in the TP groups, beside CP
    ((2, 2, 2, 1), ["--sequence-parallel"]),
    ((2, 2, 1, 2), ["--sequence-parallel", "--cp-algo", "ulysses", "--zero-stage", "1"]),
    ((2, 2, 2, 1), ["--sequence-parallel", "--recompute", "full", "--cp-layout", "contiguous"]),
]


def check_measured_is_formula(rec):
    """Every group kind on every rank: the measured calls, payload and ring bytes = the lab's formula
    (lab06's SP formulas, which test_lab06 derives; CP's, derived above), and the activations too."""
    for group, g in rec["traffic_per_group"].items():
        for key in ("calls", "payload_bytes", "ring_bytes"):
            for r, (got, want) in enumerate(zip(g[key], g[key + "_formula"])):
                check(abs(got - want) < 0.5, f"{rec['layout']} rank {r} {group} {key}: measured {got}, formula {want}")
    check(abs(rec["comm_ring_bytes_per_step"] - rec["comm_formula_bytes_per_step"]) <= 1,
          f"{rec['layout']}: ring traffic {rec['comm_ring_bytes_per_step']} != formula")
    check(rec["mem_peak_bytes_per_rank"]["acts"] == rec["acts_peak_bytes_formula_per_rank"],
          f"{rec['layout']}: activation peaks != formula")


def equivalence():
    ref, _, _ = run("lab01_dp", 1, MODEL + STEPS + ["--eval"])
    for (t, c, p, d), extra, algo in EQUIVALENCE:
        flags = MODEL + STEPS + layout(t, c, p, d) + extra + ["--eval"]
        rec, _, _ = run(LAB, t * c * p * d, flags)
        compare_runs(f"lab09 {rec['layout']} vs lab01 -n 1", rec, ref, 1e-5)
        check_dry_run(t * c * p * d, flags, rec)
        # --eval: the held-out loss, each replica on its rows' positions, averaged
        check(abs(rec["eval_loss"] - ref["eval_loss"]) <= 1e-5 * ref["eval_loss"],
              f"{rec['layout']}: held-out loss {rec['eval_loss']} != lab01's {ref['eval_loss']}")
        recompute = extra[extra.index("--recompute") + 1] if "--recompute" in extra else "none"
        check_traffic(rec, t, c, p, d, algo, recompute=recompute, zero="--zero-stage" in extra)
        if "--check-sync" in extra:
            check(rec["replicas_identical"] is True, f"{rec['layout']}: the c x d replicas differ")
        print(f"  {rec['layout']}: every group's traffic as derived, activation peaks = formula")
    for (t, c, p, d), extra in SEQUENCE_PARALLEL:
        flags = MODEL + STEPS + layout(t, c, p, d) + extra
        rec, _, _ = run(LAB, t * c * p * d, flags)
        compare_runs(f"lab09 {rec['layout']} vs lab01 -n 1", rec, ref, 1e-5)
        check_dry_run(t * c * p * d, flags, rec)
        check_measured_is_formula(rec)
        print(f"  {rec['layout']}: every group's traffic = its formula, activation peaks = formula")
    # --cp 1 is lab06's grid: the same layer, stages and replicas, so the same bits and bytes
    rec, _, _ = run(LAB, 8, MODEL + STEPS + layout(2, 1, 2, 2))
    lab06, _, _ = run("lab06_3d", 8, MODEL + STEPS + ["--tp", "2", "--pp", "2", "--dp", "2", "--micro-batches", "4"])
    check(rec["losses"] == lab06["losses"] and rec["grad_norms"] == lab06["grad_norms"],
          "lab09 --cp 1 does not train as lab06 at the same grid, bit for bit")
    check(rec["mem_peak_bytes_per_rank"] == lab06["mem_peak_bytes_per_rank"] and
          rec["comm_ring_bytes_per_step"] == lab06["comm_ring_bytes_per_step"],
          "lab09 --cp 1: memory or traffic differ from lab06's")
    print("  lab09 2x1x2x2 = lab06 2x2x2: the same losses and norms bit for bit, the same memory and traffic")


def odd():
    """An axis of 3 and a model that splits unevenly: C = 36 (not a multiple of 8),
    3 heads over 3 TP ranks, 3 layers over 2 stages, 48 positions in 6 zig-zag chunks;
    with 3 experts over an EP group of the 3 CP ranks, ZeRO-1's slices uneven."""
    model = (3, 36, 3, 8, 48)
    args = ["--layers", "3", "--d-model", "36", "--heads", "3", "--batch", "8", "--seq", "48"]
    ref, _, _ = run("lab01_dp", 1, args + STEPS)
    for dims in ((1, 3, 2, 1), (3, 2, 1, 1)):
        rec, _, _ = run(LAB, dims[0] * dims[1] * dims[2] * dims[3], args + STEPS + layout(*dims))
        compare_runs(f"lab09 {rec['layout']} (odd model) vs lab01 -n 1", rec, ref, 1e-5)
        check_traffic(rec, *dims, model=model)
    experts = ["--experts", "3", "--capacity-factor", "1.0"]
    ref, _, _ = run("lab01_dp", 1, args + STEPS + experts)
    rec, _, out = run(LAB, 6, args + STEPS + experts + layout(1, 3, 2, 1) + ["--ep", "3", "--zero-stage", "1",
                                                                           "--micro-batches", "2"])
    name = f"lab09 {rec['layout']} (odd model)"
    compare_runs(f"{name} vs lab01 -n 1 --experts 3", rec, ref, 1e-5)
    same_routing(name, rec, ref)
    check_group_traffic(name, rec, {"cp": 3, "pp": 2, "dp": 3, "ep": 3, "edp": 1})
    chk = subprocess.run([program("plan3d"), "--check", out, "--calibration", os.path.join(out, "none.json")],
                         capture_output=True, text=True)
    print(chk.stdout.strip().splitlines()[-1] if chk.stdout.strip() else chk.stderr)
    check(chk.returncode == 0 and "1/1 exact" in chk.stdout, f"{name}: plan3d --check {chk.stdout[-1500:]}")


def check_group_traffic(name, rec, sizes):
    """A run with experts: each group of more than one rank in the record (lab06's table), its measured calls,
    payload and ring bytes = its formula on every rank (the all-to-alls' payload: the run's routing), and the
    summary's busiest-rank formula = the measured ring traffic."""
    check(set(rec["traffic_per_group"]) == {g for g, size in sizes.items() if size > 1},
          f"{name}: groups {sorted(rec['traffic_per_group'])}")
    for group, g in rec["traffic_per_group"].items():
        check(g["group_size"] == sizes[group], f"{name}: {group} of {g['group_size']} ranks")
        for key in ("calls", "payload_bytes", "ring_bytes"):
            for r, (got, want) in enumerate(zip(g[key], g[key + "_formula"])):
                check(abs(got - want) < 0.5, f"{name} rank {r} {group} {key}: measured {got}, formula {want}")
    check(abs(rec["comm_ring_bytes_per_step"] - rec["comm_formula_bytes_per_step"]) <= 1,
          f"{name}: ring traffic {rec['comm_ring_bytes_per_step']} != formula {rec['comm_formula_bytes_per_step']}")


def full_grid():
    """All four axes at once on 16 ranks: tp 2 x cp 2 x pp 2 x dp 2, ZeRO-1 over the 4 replicas."""
    ref, _, _ = run("lab01_dp", 1, MODEL + STEPS)
    rec, _, _ = run(LAB, 16, MODEL + STEPS + layout(2, 2, 2, 2) + ["--zero-stage", "1", "--check-sync"])
    compare_runs(f"lab09 {rec['layout']} vs lab01 -n 1", rec, ref, 1e-5)
    check_traffic(rec, 2, 2, 2, 2, zero=True)
    check(rec["replicas_identical"] is True, f"{rec['layout']}: the 4 replicas of a (tp, pp) differ")


def same_routing(name, rec, ref):
    """Top-k routing decided the same: every step's dropped choices and the last step's choices per expert
    exactly (counted before dropping), the aux losses within rounding; with --balance bias, the bias too."""
    check(rec["dropped_per_step"] == ref["dropped_per_step"],
          f"{name}: dropped {rec['dropped_per_step']}, lab01 {ref['dropped_per_step']}")
    check(rec["expert_choices_last_step"] == ref["expert_choices_last_step"], f"{name}: the expert loads differ")
    for key in ("bias_min_per_step", "bias_max_per_step", "load_imbalance_per_step"):
        if key in ref:
            check(rec[key] == ref[key], f"{name}: {key} {rec[key]}, lab01 {ref[key]}")
    aux = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(rec["aux_losses"], ref["aux_losses"]))
    check(aux <= 1e-5, f"{name}: aux losses differ by {aux:.2e}")


EXPERTS = ["--experts", "4", "--capacity-factor", "1.0"]
DEEPSEEK = ["--experts", "4", "--router", "sigmoid", "--balance", "bias", "--bias-speed", "0.01"]


def experts_layouts(layouts):
    """Each layout against lab01 -n 1 --experts 4: losses, norms, the same drops and loads; the memory per rank
    and category is theory's (the dry run's, and plan3d --check's), and so is every collective kind but the
    all-to-alls (the routing decides their bytes); each group's traffic is its formula."""
    ref, _, _ = run("lab01_dp", 1, MODEL + STEPS + EXPERTS)
    check(sum(ref["dropped_per_step"]) > 0, "the capacity drops nothing: the drops would not be compared")
    full, _, _ = run("lab01_dp", 1, MODEL + STEPS + EXPERTS + ["--recompute", "full"])
    records = tempfile.mkdtemp(prefix="pl-experts-")  # every layout's record, for plan3d --check below
    for dims, extra in layouts:
        n = dims[0] * dims[1] * dims[2] * dims[3]
        flags = MODEL + STEPS + layout(*dims) + EXPERTS + extra
        rec, _, _ = run(LAB, n, flags, out=records)
        name = f"lab09 {rec['layout']}"
        base = full if "--recompute" in extra else ref
        compare_runs(f"{name} vs lab01 -n 1 --experts 4", rec, base, 1e-5)
        same_routing(name, rec, base)
        if "--check-sync" in extra:  # the ranks holding the same experts (EDP) hold the same buffers
            check(rec["replicas_identical"] is True, f"{name}: the EDP groups' weights differ")
        _, dry, _ = run(LAB, n, flags + ["--dry-run"])
        rows = {int(x.group(1)): x.group(0).split() for x in map(PREDICTED_ROW_EXPERTS.match, dry.stdout.splitlines())
                if x}
        mem = rec["mem_peak_bytes_per_rank"]
        check(sorted(rows) == list(range(n)), f"{name}: the dry run's rows {sorted(rows)}")
        for r in range(n):  # params, grads, optim: the rank's runs (E/e experts a layer), by th_stage_params
            want = tuple(int(x) for x in rows[r][-7:-4])
            check((mem["params"][r], mem["grads"][r], mem["optim"][r]) == want,
                  f"{name} rank {r}: model states {mem['params'][r]} {mem['grads'][r]} {mem['optim'][r]}, dry run {want}")
            # with a capacity: every block's received rows at its bound, and the scratch (not under --recompute
            # full, whose recomputed layers claim the hook's buffers otherwise: '?'); comm: lab04's message pool
            acts, workspace = rows[r][-4], rows[r][-2]
            recomputed = "--recompute" in extra
            check((acts == workspace == "?") if recomputed else (int(acts), int(workspace)) == (mem["acts"][r], mem["workspace"][r]),
                  f"{name} rank {r}: acts {mem['acts'][r]}, workspace {mem['workspace'][r]}; dry run {acts}, {workspace}")
        # the gradients' sums (replicated runs over the replicas, expert runs over EDP), the pipeline's
        # messages, CP's exchanges and the routing's gathers over the CP group, as the dry run predicts
        kinds = set(re.findall(r"\| (\w+) [\d.]+ calls", dry.stdout)) | set(rec["comm_calls_per_step"])
        kinds.discard("alltoall")
        check(rec["cp"] == 1 or "allgather" in kinds, f"{name}: no routing gathers over the CP group")
        for kind in sorted(kinds):
            per_rank = [(float(c), int(b)) for c, b in re.findall(kind + r" ([\d.]+) calls, payload (\d+)", dry.stdout)]
            want = (max(c for c, _ in per_rank), max(b for _, b in per_rank)) if per_rank else (0, 0)
            got = (rec["comm_calls_per_step"].get(kind, 0), rec["comm_bytes_per_step"].get(kind, 0))
            check(len(per_rank) in (0, n) and got == want, f"{name}: {kind} per step {got}, the dry run's {want}")
        # each group's traffic (lab06's table); at --ep 1 the experts' sums are the replicas' (no EDP group)
        t, c, p, d = dims
        e = int(extra[extra.index("--ep") + 1])
        check_group_traffic(name, rec, {"tp": t, "cp": c, "seq": t * c if t > 1 and c > 1 else 1, "pp": p,
                                        "dp": c * d, "stage": t * c * d if t > 1 else 1, "ep": e,
                                        "edp": t * c * d // e if e > 1 else 1})
        print(f"  {name}: lab01's losses, norms, drops and loads; model states, activations, workspace and "
              f"{', '.join(sorted(kinds))} per rank = the dry run's; each group's traffic = its formula")
    # plan3d --check reads the records (the th_run each dry run predicted from) and predicts them the same
    chk = subprocess.run([program("plan3d"), "--check", records, "--calibration", os.path.join(records, "none.json")],
                         capture_output=True, text=True)
    print(chk.stdout.strip().splitlines()[-1] if chk.stdout.strip() else chk.stderr)
    check(chk.returncode == 0 and f"{len(layouts)} runs checked: {len(layouts)}/{len(layouts)} exact" in chk.stdout,
          f"plan3d --check of lab09's experts records: status {chk.returncode}: {chk.stdout[-2000:]} {chk.stderr}")


def experts():
    """lab08's experts on the grid at t = 1: pipeline stages x EP groups carved from the replicas, CP's
    attention beside them (the routing sees whole sequences over the CP group), ZeRO-1 per kind of run;
    DeepSeek-V3's routing; checkpoints across layouts and labs."""
    experts_layouts((
        ((1, 1, 2, 4), ["--ep", "2", "--micro-batches", "2", "--check-sync"]),  # DeepSeek-V3's shape
        ((1, 1, 2, 2), ["--ep", "1", "--schedule", "interleaved", "--micro-batches", "2"]),
        # CP beside EP: the EP group across CP and DP
        ((1, 2, 1, 2), ["--ep", "4", "--cp-algo", "ulysses", "--micro-batches", "2"]),
        ((1, 2, 2, 2), ["--ep", "2", "--cp-algo", "allgather", "--micro-batches", "2",
                        "--check-sync"]),
        # full recomputation reruns each layer's forward, its all-to-alls too, before the backward
        ((1, 2, 2, 1), ["--ep", "2", "--cp-layout", "contiguous", "--recompute", "full"]),
        # ZeRO-1: replicated runs sharded over the replicas, expert runs over EDP (or both over
        # the replicas at --ep 1; EDP of one rank: the expert runs whole)
        ((1, 1, 2, 4), ["--ep", "2", "--micro-batches", "2", "--zero-stage", "1", "--check-sync"]),
        ((1, 2, 1, 2), ["--ep", "1", "--zero-stage", "1"]),
        ((1, 2, 2, 2), ["--ep", "4", "--micro-batches", "2", "--zero-stage", "1"])))
    # DeepSeek-V3's routing: sigmoid scores, balance by a bias moved by the global load (no aux loss)
    ref, _, _ = run("lab01_dp", 1, MODEL + STEPS + DEEPSEEK)
    for dims, ep in (((1, 1, 2, 4), "2"), ((1, 2, 2, 2), "4")):  # the bias moves by the load over every rank
        rec, _, _ = run(LAB, 8, MODEL + STEPS + layout(*dims) + DEEPSEEK + ["--ep", ep, "--micro-batches", "2"])
        compare_runs(f"lab09 {rec['layout']} DeepSeek routing vs lab01 -n 1", rec, ref, 1e-5)
        same_routing(f"lab09 {rec['layout']} DeepSeek routing", rec, ref)
    # a checkpoint crosses into lab08 and lab01 and back: the experts at their global offsets
    saved = os.path.join(tempfile.mkdtemp(prefix="pl-ckpt-"), "ck.safetensors")
    run(LAB, 4, MODEL + ["--steps", "5"] + layout(1, 1, 2, 2) + EXPERTS + ["--ep", "2", "--save", saved])
    serial, _, _ = run("lab01_dp", 1, MODEL + STEPS + EXPERTS)
    for lab, n, flags in (("lab08_ep", 2, ["--ep", "2"]), ("lab01_dp", 1, []),
                          (LAB, 8, layout(1, 2, 1, 4) + ["--ep", "2", "--zero-stage", "1", "--micro-batches", "2"]),
                          (LAB, 8, layout(2, 1, 2, 2) + ["--ep", "4", "--sequence-parallel"])):
        rec, _, _ = run(lab, n, MODEL + ["--steps", "5", "--resume", saved] + EXPERTS + flags)
        compare_runs(f"saved by lab09 pp2 x ep2, resumed by {lab} -n {n} {' '.join(flags)}", rec, serial, 1e-5,
                     ref_from=5)
    # and one saved under ZeRO-1 (the moments in slices over the replicas and EDP) resumes whole in lab01
    run(LAB, 8, MODEL + ["--steps", "5"] + layout(1, 1, 2, 4) + EXPERTS + ["--ep", "2", "--zero-stage", "1",
                                                                          "--micro-batches", "2", "--save", saved])
    rec, _, _ = run("lab01_dp", 1, MODEL + ["--steps", "5", "--resume", saved] + EXPERTS)
    compare_runs("saved by lab09 pp2 x ep2 x ZeRO-1, resumed by lab01_dp -n 1", rec, serial, 1e-5, ref_from=5)


def experts_tp():
    """lab08's experts beside TP under SP (Megatron's MoE shape): EP groups carved from the stage's t x c x d
    ranks, the routing over the t x c ranks of a sequence, ZeRO-1's three kinds of run over their groups."""
    experts_layouts((
        # EP groups carved across TP ranks too, the routing over the t x c ranks of a sequence
        ((2, 1, 2, 2), ["--ep", "2", "--sequence-parallel", "--check-sync"]),
        ((2, 2, 1, 2), ["--ep", "4", "--sequence-parallel", "--zero-stage", "1", "--micro-batches", "2"]),
        ((2, 2, 2, 1), ["--ep", "1", "--sequence-parallel", "--recompute", "full", "--micro-batches", "2"])))
    # --experts with no degree on 8 ranks: tp 2 x cp 2 x pp 2 with EP 2 folded over each stage, SP on by itself
    _, dry, _ = run(LAB, 8, MODEL + EXPERTS + ["--dry-run"])
    want = "tp=2 cp=2 pp=2 dp=1 m=4 1f1b ring zigzag sp ep=2 E=4 k=2"
    check(want in dry.stdout, f"lab09 -n 8 --experts 4: the dry run's layout is not {want}")
    serial, _, _ = run("lab01_dp", 1, MODEL + STEPS + EXPERTS)
    saved = os.path.join(tempfile.mkdtemp(prefix="pl-ckpt-"), "ck.safetensors")
    # and beside TP (attention's shards at their global places, the three kinds' slices)
    run(LAB, 8, MODEL + ["--steps", "5"] + layout(2, 2, 1, 2) + EXPERTS + ["--ep", "4", "--sequence-parallel",
                                                                          "--zero-stage", "1", "--micro-batches", "2",
                                                                          "--save", saved])
    rec, _, _ = run("lab01_dp", 1, MODEL + ["--steps", "5", "--resume", saved] + EXPERTS)
    compare_runs("saved by lab09 tp2 x cp2 x ep4 x ZeRO-1, resumed by lab01_dp -n 1", rec, serial, 1e-5, ref_from=5)


def schedules():
    ref, _, _ = run("lab01_dp", 1, MODEL + STEPS)
    for schedule in ("interleaved", "zb-v", "gpipe"):
        rec, _, _ = run(LAB, 4, MODEL + STEPS + layout(1, 2, 2, 1) + ["--schedule", schedule])
        compare_runs(f"lab09 {rec['layout']} vs lab01 -n 1", rec, ref, 1e-5)
        check_traffic(rec, 1, 2, 2, 1, schedule=schedule)


def precision():
    bf16 = ["--precision", "bf16"]
    ref, _, _ = run("lab01_dp", 1, MODEL + STEPS + bf16)
    for dims, extra in (((1, 2, 2, 1), []), ((2, 2, 1, 2), ["--zero-stage", "1"])):
        rec, _, _ = run(LAB, dims[0] * dims[1] * dims[2] * dims[3], MODEL + STEPS + layout(*dims) + bf16 + extra)
        # within lab06's bound of lab01's bf16 run (test_lab06 zero1)
        compare_runs(f"lab09 {rec['layout']} bf16 vs lab01 -n 1 bf16", rec, ref, 5e-4, grad_rtol=BF16_GRAD_NORM_RTOL)
        check_traffic(rec, *dims, vb=2, zero=bool(extra))


def resume():
    """A file saved at one layout resumes at another, and in lab01, on the serial curve."""
    ref, _, _ = run("lab01_dp", 1, MODEL + STEPS)
    saved = os.path.join(tempfile.mkdtemp(prefix="pl-ckpt-"), "ck.safetensors")
    run(LAB, 8, MODEL + ["--steps", "5"] + layout(2, 2, 2, 1) + ["--save", saved])
    check(os.path.exists(saved), f"no checkpoint at {saved}")
    for lab, n, flags in ((LAB, 8, layout(1, 2, 2, 2) + ["--zero-stage", "1"]), (LAB, 4, layout(2, 1, 1, 2)),
                          ("lab01_dp", 1, [])):
        rec, _, _ = run(lab, n, MODEL + ["--steps", "5", "--resume", saved] + flags)
        compare_runs(f"saved by lab09 2x2x2x1, resumed by {lab} -n {n} {' '.join(flags)}", rec, ref, 1e-5, ref_from=5)


# a dry run's row with experts: rank, tp (cp) pp dp, layers, params grads optim, then ? for the rest
PREDICTED_ROW_EXPERTS = re.compile(r"^\s+(\d+)(?:\s+\d+){3,4}\s+\S+\s+\d+\s+\d+\s+\d+\s+(?:\d+|\?)\s+\?\s+(?:\d+|\?)\s+\?$")
# the dry run's row of a rank: rank, tp cp pp dp (cp only where c > 1), layers, the six categories, the sum
PREDICTED_ROW = re.compile(r"^\s+(\d+)(?:\s+\d+){3,4}\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+\S+$")


def check_dry_run(n, flags, rec):
    """The dry run's memory per rank and category (theory/predict.c) = rec's allocator peaks (a run's peaks do not
    depend on its steps)."""
    _, dry, _ = run(LAB, n, flags + ["--dry-run"])
    rows = {int(m.group(1)): m.groups()[1:] for m in map(PREDICTED_ROW.match, dry.stdout.splitlines()) if m}
    check(sorted(rows) == list(range(n)), f"dry run: predicted rows for ranks {sorted(rows)}")
    mem = rec["mem_peak_bytes_per_rank"]
    for r in range(n):
        params, grads, optim, acts, _comm, workspace = rows[r]
        got = (mem["params"][r], mem["grads"][r], mem["optim"][r], mem["acts"][r], mem["workspace"][r])
        want = tuple(int(x) for x in (params, grads, optim, acts, workspace))
        check(got == want, f"{rec['layout']} rank {r}: params, grads, optim, acts, workspace {got} "
              f"measured, {want} predicted")
    print(f"  {rec['layout']}: every rank's memory per category = the dry run's prediction")


def dry_run():
    """The dry run's memory per rank and category (theory/predict.c) = the run's allocator peaks, at layouts
    beyond the equivalence test's (which holds its own layouts to their dry runs)."""
    for (t, c, p, d), extra in (((1, 2, 2, 1), ["--schedule", "zb-v"]), ((2, 1, 2, 2), []),
                                ((2, 2, 1, 2), ["--zero-stage", "1", "--precision", "bf16"])):
        flags = MODEL + ["--steps", "2"] + layout(t, c, p, d) + extra
        rec, _, _ = run(LAB, t * c * p * d, flags)
        check_dry_run(t * c * p * d, flags, rec)


def planner():
    """plan3d's first answer (llama3-70b on 64 H100s), scaled down: its degrees, schedule, recompute
    and ZeRO stage kept, the model the course's; 64 ranks on this machine. The losses and norms are
    lab01's, and every rank's memory per category is the dry run's (theory/predict.c, plan3d's formulas)."""
    out = subprocess.run([program("plan3d")], capture_output=True, text=True, check=True).stdout
    best = re.search(r"^best: tp=(\d+) cp=(\d+) pp=(\d+) dp=(\d+) .*?m=(\d+) (\S+)(?: v=\d+)?( sp)? recompute=(\w+)",
                     out, re.M)
    check(best is not None, "plan3d printed no `best:` line")
    t, c, p, d = (int(best.group(i)) for i in range(1, 5))
    schedule, recompute = best.group(6), best.group(8)
    zero = re.search(r"ZeRO stage (\d)", out)
    # the course's model: 8 layers, T = 64, batch 32; micro-batches: as many as a replica's rows allow, at most 8
    # (the plan's m is for 512 sequences)
    m = min(8, 32 // d)
    flags = ["--steps", "2"] + layout(t, c, p, d) + ["--schedule", schedule, "--recompute", recompute,
                                                     "--micro-batches", str(m)]
    if best.group(7):
        flags.append("--sequence-parallel")
    if zero and int(zero.group(1)) >= 1 and c * d > 1:
        flags += ["--zero-stage", "1"]
    print(f"plan3d's layout: tp={t} cp={c} pp={p} dp={d} {schedule} recompute={recompute}{best.group(7) or ''} "
          f"(m={best.group(5)}); run as lab09 {' '.join(flags)}")
    ref, _, _ = run("lab01_dp", 1, ["--steps", "2", "--recompute", recompute])
    n = t * c * p * d
    _, dry, _ = run(LAB, n, flags + ["--dry-run"])
    rows = {int(x.group(1)): x.groups()[1:] for x in map(PREDICTED_ROW.match, dry.stdout.splitlines()) if x}
    rec, _, _ = run(LAB, n, flags, timeout=900)
    compare_runs(f"lab09 {rec['layout']} (plan3d's layout) vs lab01 -n 1", rec, ref, 1e-5)
    mem = rec["mem_peak_bytes_per_rank"]
    shown = sorted(rows)  # the dry run prints the first ranks' rows
    check(shown, "the dry run printed no rank rows")
    for r in shown:
        params, grads, optim, acts, _comm, workspace = rows[r]
        got = (mem["params"][r], mem["grads"][r], mem["optim"][r], mem["acts"][r], mem["workspace"][r])
        check(got == tuple(int(x) for x in (params, grads, optim, acts, workspace)),
              f"rank {r}: measured {got}, predicted {rows[r]}")
    check(abs(rec["comm_ring_bytes_per_step"] - rec["comm_formula_bytes_per_step"]) <= 1, "ring traffic != formula")
    # and plan3d --check predicts the record: every rank's memory per category, every collective kind
    folder = os.path.dirname(rec["trace"]) if rec.get("trace") else None
    check(folder and os.path.exists(os.path.join(folder, "records.jsonl")), "no records.jsonl beside the run's trace")
    chk = subprocess.run([program("plan3d"), "--check", folder, "--calibration", os.path.join(folder, "none.json")],
                         capture_output=True, text=True)
    print(chk.stdout.strip().splitlines()[-1] if chk.stdout.strip() else chk.stderr)
    check(chk.returncode == 0 and "1/1 exact" in chk.stdout, f"plan3d --check of the planner's layout: {chk.stdout}")
    print(f"  {n} ranks: the losses and norms of lab01 -n 1; memory of ranks {shown[0]}-{shown[-1]} = the dry run's; "
          "plan3d --check exact")


if __name__ == "__main__":
    {"equivalence": equivalence, "odd": odd, "schedules": schedules, "precision": precision, "resume": resume,
     "dry_run": dry_run, "planner": planner, "full_grid": full_grid, "experts": experts,
     "experts_tp": experts_tp}[sys.argv[1]]()
    print("passed")
