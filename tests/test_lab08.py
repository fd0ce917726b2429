"""lab08_ep against its promises: every expert-parallel layout (EP degree x
expert data parallelism, E/N experts per rank) trains as `lab01 -n 1
--experts E` does, with top-1 and top-2, with and without dropping (capacity
is decided per sequence, so the same choices drop at every layout); the
all-to-all bytes comm measured are the exact count from the routing; the
uniform-routing expectation is 4 k N_tok C b (N-1)/N per layer, derived here;
a rank holds the replicated weights and E/N of the experts.

usage: test_lab08.py equivalence|sweep|precision|resume|dry_run|capacity_scope|capacity_limits|margin|deepseek"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import _pad, acts_bytes, check, compare_losses, compare_runs, run  # noqa: E402

LAB = "lab08_ep"
# odd shapes on purpose: C = 36 (not a multiple of 8), 3 heads; batch 12 divides over 1-4 ranks
L, C, H, B, T = 2, 36, 3, 12, 24
ARGS = ["--steps", "20", "--layers", str(L), "--d-model", str(C), "--heads", str(H),
        "--batch", str(B), "--seq", str(T)]
ROUTING = {"k2": ["--top-k", "2"], "k1": ["--top-k", "1"],
           "k2-drop": ["--top-k", "2", "--capacity-factor", "1.0"], "k1-drop": ["--top-k", "1", "--capacity-factor", "1.0"]}


def params_per_rank(E, N, M=4 * C, S=0):
    """Elements a rank holds, derived here: embeddings, head, per layer the
    LayerNorms, attention and router whole, E/N experts' MLPs of M hidden units,
    and S shared experts whole (one MLP of S M units, one output bias)."""
    V = 256
    attention = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C
    expert = C * M + M + M * C + C
    shared = C * S * M + S * M + S * M * C + C if S else 0
    return V * C + T * C + L * (attention + E * C + E // N * expert + shared) + 2 * C + V * C


def acts_per_rank(ranks, ep, E, k, received):
    """fp32 activation bytes a rank allocates, derived here: lab01's layers less each layer's
    fch and GELU [N,4C] (the experts' hidden rows live in lab08's hook), plus per layer the
    router state (probs [N,E]; choice, gate, slot [N,k]; count, first [E]; freq [rows,E];
    xs, ys [N k,C]) and its 6 + E statistics, plus `received` rows of xr, yr [.,C] and fch,
    GELU [.,4C] (separate allocations, counted unpadded)."""
    rows = B // ranks
    N = rows * T
    router = _pad(N * E) + 3 * _pad(N * k) + 2 * _pad(E) + _pad(rows * E) + 2 * _pad(N * k * C)
    layer = router - 2 * _pad(N * 4 * C) + _pad(6 + E)
    return acts_bytes(rows, T, C, H, L) + 4 * L * layer + L * max(received, 1) * 10 * C * 4


def received_bound(ranks, ep, E, k, F):
    """The most slot rows a rank receives per layer: per sequence of each of the ep ranks,
    min(cap, T) for each of its E/ep experts (cap = ceil(k T F / E); T without one), k T in all."""
    cap = min(-(-k * T * F // E), T) if F > 0 else T
    return ep * (B // ranks) * min(E // ep * cap, k * T)


def check_acts(name, rec, ranks, ep, E, k, F):
    """allocator = theory.h = derived here: exact from the config with a capacity (the
    buffers are sized to its bound); without one the routing decides, between 1 row and
    the capacity-free bound per layer."""
    measured, formula = rec["mem_peak_bytes_per_rank"]["acts"], rec["acts_peak_bytes_formula_per_rank"]
    check(measured == formula, f"{name}: activations measured {measured} != theory.h {formula}")
    bound = received_bound(ranks, ep, E, k, F)
    if F > 0:
        want = acts_per_rank(ranks, ep, E, k, bound)
        check(measured == [want] * ranks, f"{name}: activations {measured} != {want} derived from the config")
    else:
        lo, hi = acts_per_rank(ranks, ep, E, k, 1), acts_per_rank(ranks, ep, E, k, bound)
        check(all(lo <= m <= hi for m in measured), f"{name}: activations {measured} outside [{lo}, {hi}]")


def check_layout(name, rec, ranks, ep, E, k):
    check((rec["ep"], rec["edp"]) == (ep, ranks // ep), f"{name}: groups {rec['ep']} x {rec['edp']}")
    # comm's counter (payload, own block included) = the routing's rows and counts, to others and to itself
    # (per-step means printed to the byte: each rounded once)
    check(abs(rec["alltoall_payload_per_step"] - rec["alltoall_sent_per_step"] - rec["alltoall_own_per_step"]) <= 1,
          f"{name}: all-to-all payload {rec['alltoall_payload_per_step']} != sent {rec['alltoall_sent_per_step']}"
          f" + own {rec['alltoall_own_per_step']}")
    if ep == 1:
        check(rec["alltoall_sent_per_step"] == 0, f"{name}: one rank per EP group sends nothing")
    tokens = B // ranks * T
    uniform = L * 4 * k * tokens * C * 4 * (ep - 1) / ep
    check(abs(rec["alltoall_uniform_per_step"] - uniform) <= 0.5,
          f"{name}: uniform all-to-all {rec['alltoall_uniform_per_step']} != {uniform} derived")
    want = params_per_rank(E, ep) * 4
    check(rec["mem_peak_bytes_per_rank"]["params"] == [want] * ranks,
          f"{name}: parameter bytes per rank {rec['mem_peak_bytes_per_rank']['params']} != {want} derived")
    states = rec["model_state_bytes_per_param"]  # the allocator over the parameters the rank holds
    check([states["params"], states["grads"], states["optim"]] == states["formula"] == [4, 4, 8],
          f"{name}: model states per parameter held {states}")
    choices = rec["expert_choices_last_step"]
    for layer in range(L):  # every token chose k experts, counted over all ranks
        check(sum(choices[layer * E:(layer + 1) * E]) == k * B * T, f"{name}: layer {layer} choices {choices}")


def sweep(cases):
    refs = {}
    for ranks, ep, E, routings in cases:
        for r in routings:
            extra = ["--experts", str(E)] + ROUTING[r]
            if (E, r) not in refs:
                refs[(E, r)], _, _ = run("lab01_dp", 1, ARGS + extra)
            ref = refs[(E, r)]
            name = f"-n {ranks} --ep {ep} E={E} {r}"
            rec, _, _ = run(LAB, ranks, ARGS + extra + ["--ep", str(ep)])
            # expert gradients are summed in the EP group, then over EDP: another rounding
            # order than lab01's one matrix, not bitwise
            compare_runs(f"lab08 {name} vs lab01 -n 1", rec, ref, 1e-5)
            compare_losses(f"lab08 {name} aux loss vs lab01 -n 1", rec["aux_losses"], ref["aux_losses"], 1e-4)
            check(rec["dropped_per_step"] == ref["dropped_per_step"],
                  f"{name}: dropped choices {rec['dropped_per_step']} != lab01's {ref['dropped_per_step']}")
            if "drop" in r:
                check(sum(ref["dropped_per_step"]) > 0, f"{name}: F = 1.0 should drop some choices here")
            else:
                check(sum(rec["dropped_per_step"]) == 0, f"{name}: F = 0 drops nothing")
            check_layout(name, rec, ranks, ep, E, int(ROUTING[r][1]))
            check_acts(name, rec, ranks, ep, E, int(ROUTING[r][1]), 1.0 if "drop" in r else 0)
            print(f"{name}: a2a sent {rec['alltoall_sent_per_step']} B/step (uniform "
                  f"{rec['alltoall_uniform_per_step']:.0f}), dropped {sum(rec['dropped_per_step']):.0f}")


def equivalence():
    """Every layout of 1-4 ranks once, the four routings spread over them (< 2 minutes on 2 cores)."""
    sweep([(1, 1, 4, ["k2-drop"]), (2, 2, 4, ["k1", "k2-drop"]), (2, 1, 4, ["k1-drop"]),
           (3, 3, 3, ["k2", "k1-drop"]), (3, 3, 6, ["k2-drop"]),
           (4, 4, 4, ["k2", "k1-drop"]), (4, 2, 4, ["k1", "k2-drop"]), (4, 1, 4, ["k2"])])


def sweep_all():
    """Every layout with every routing (label long)."""
    every = list(ROUTING)
    sweep([(1, 1, 4, every), (2, 2, 4, every), (2, 1, 4, every), (3, 3, 3, every), (3, 3, 6, every),
           (3, 1, 6, every), (4, 4, 4, every), (4, 2, 4, every), (4, 4, 8, every), (4, 1, 4, every)])


def precision():
    """--recompute selective and full reproduce none bit for bit (the forward and its
    all-to-alls run again); bf16 trains as lab01's bf16 does."""
    base, _, _ = run(LAB, 2, ARGS)
    for mode in ("selective", "full"):
        rec, _, _ = run(LAB, 2, ARGS + ["--recompute", mode])
        check(rec["losses"] == base["losses"], f"--recompute {mode}: losses differ from none")
        acts = rec["mem_peak_bytes_per_rank"]["acts"]
        check(acts == rec["acts_peak_bytes_formula_per_rank"] and all(
            a < b for a, b in zip(acts, base["mem_peak_bytes_per_rank"]["acts"])),  # the same routing: less kept
              f"--recompute {mode}: activations {acts} vs theory.h {rec['acts_peak_bytes_formula_per_rank']}")
        print(f"--recompute {mode}: bit-identical losses")
    ref, _, _ = run("lab01_dp", 1, ARGS + ["--experts", "4", "--precision", "bf16", "--capacity-factor", "1.25"])
    rec, _, _ = run(LAB, 2, ARGS + ["--precision", "bf16", "--capacity-factor", "1.25"])
    check(rec["mem_peak_bytes_per_rank"]["acts"] == rec["acts_peak_bytes_formula_per_rank"],
          f"bf16: activations {rec['mem_peak_bytes_per_rank']['acts']} vs {rec['acts_peak_bytes_formula_per_rank']}")
    compare_runs("lab08 -n 2 bf16 vs lab01 -n 1 bf16", rec, ref, 2e-3)


def resume():
    """--save at ep = 2, --resume at ep = 2 x edp = 2 and in lab01: a rank holds its
    experts' runs of the global layout, so any layout continues the same run."""
    import tempfile
    ck = os.path.join(tempfile.mkdtemp(prefix="pl-l8ck-"), "ck.safetensors")
    extra = ["--experts", "4", "--capacity-factor", "1.0"]
    ref, _, _ = run("lab01_dp", 1, ARGS + extra)
    half = [a if a != "20" else "10" for a in ARGS] + extra
    first, _, _ = run(LAB, 2, half + ["--save", ck])
    compare_runs("lab08 -n 2 steps 1-10 vs lab01", first, ref, 1e-5, ref_to=10)
    evals, samples = [], []
    for lab, n, more in ((LAB, 4, ["--ep", "2"]), ("lab01_dp", 1, [])):
        rec, p, _ = run(lab, n, half + more + ["--resume", ck, "--eval", "--sample", "24"])
        compare_runs(f"{lab} -n {n} {' '.join(more)} resumed, steps 11-20 vs lab01", rec, ref, 1e-5, ref_from=10)
        evals.append(rec)
        # --sample gathers the weights through the checkpoint view: every rank's runs of the layout
        samples.append([line for line in p.stdout.splitlines() if line.startswith("sample after 20 steps")])
    check(len(samples[0]) == 1 and samples[0] == samples[1], f"--sample: lab08 {samples[0]} vs lab01 {samples[1]}")
    # --eval: the held-out loss over the same global tokens, forward only; its all-to-alls stay out of the counts
    check(abs(evals[0]["eval_loss"] - evals[1]["eval_loss"]) <= 1e-5 * evals[1]["eval_loss"],
          f"--eval: lab08 {evals[0]['eval_loss']} vs lab01 {evals[1]['eval_loss']}")
    check(abs(evals[0]["alltoall_payload_per_step"] - evals[0]["alltoall_sent_per_step"]
              - evals[0]["alltoall_own_per_step"]) <= 1, "--eval: the all-to-all counts disagree")
    print(f"--eval after resuming: lab08 {evals[0]['eval_loss']:.6f}, lab01 {evals[1]['eval_loss']:.6f}")


def capacity_scope():
    """The negative experiment: a capacity per sequence (the default) drops the same choices at
    every layout, so -n 4 trains as -n 1; --capacity-scope rank counts a rank's own B/N rows,
    so the drops, and with them the losses, change with the number of ranks (and -n 1 with a
    rank's capacity is lab01 -n 1's, the whole batch one rank's rows)."""
    extra = ["--experts", "4", "--capacity-factor", "1.0"]
    short = [a if a != "20" else "8" for a in ARGS] + extra
    runs = {}
    for scope in ("sequence", "rank"):
        for n in (1, 4):
            runs[(scope, n)], _, _ = run(LAB, n, short + ["--capacity-scope", scope])
            rec = runs[(scope, n)]
            check(rec["mem_peak_bytes_per_rank"]["acts"] == rec["acts_peak_bytes_formula_per_rank"],
                  f"--capacity-scope {scope} -n {n}: activations {rec['mem_peak_bytes_per_rank']['acts']} vs "
                  f"theory.h {rec['acts_peak_bytes_formula_per_rank']}")
    one, four = runs[("sequence", 1)], runs[("sequence", 4)]
    compare_runs("per sequence: -n 4 vs -n 1", four, one, 1e-5)
    check(four["dropped_per_step"] == one["dropped_per_step"], "per sequence: the same drops at -n 1 and -n 4")
    one, four = runs[("rank", 1)], runs[("rank", 4)]
    gap = max(abs(a - b) for a, b in zip(one["losses"], four["losses"]))
    check(four["dropped_per_step"] != one["dropped_per_step"] and gap > 1e-4,
          f"per rank: -n 4 should drop otherwise than -n 1 (drops {four['dropped_per_step']} vs "
          f"{one['dropped_per_step']}, losses differ by {gap:.2e})")
    ref, _, _ = run("lab01_dp", 1, short + ["--capacity-scope", "rank"])
    compare_runs("per rank: lab08 -n 1 vs lab01 -n 1", one, ref, 1e-5)
    print(f"per sequence: -n 4 = -n 1 (drops {runs[('sequence', 1)]['dropped_per_step'][-1]:.0f} in the last step); per rank: drops "
          f"{runs[('rank', 1)]['dropped_per_step']} at -n 1 vs {four['dropped_per_step']} at -n 4, losses differ by "
          f"up to {gap:.2e}")


def capacity_limits():
    """A capacity factor so large that no expert can fill it is no limit, in every scope and lab
    that takes experts (ceil(k T F / E) past 2^31 - 1 used to become a negative int: every choice
    dropped, every step); its dry run is exact, as for any capacity."""
    short = [a if a != "20" else "3" for a in ARGS] + ["--experts", "4"]
    ref, _, _ = run("lab01_dp", 1, short)
    check(sum(ref["dropped_per_step"]) == 0, "F = 0 drops nothing")
    for lab, n, extra in [(LAB, 2, []), (LAB, 2, ["--capacity-scope", "rank"]), ("lab01_dp", 1, []),
                          ("lab01_dp", 2, ["--capacity-scope", "rank"]), ("lab02_zero", 2, ["--zero-stage", "2"])]:
        for F in ("1e9", "3e38"):
            name = f"{lab} -n {n} --capacity-factor {F} {' '.join(extra)}"
            rec, _, _ = run(lab, n, short + ["--capacity-factor", F] + extra)
            check(sum(rec["dropped_per_step"]) == 0, f"{name}: dropped {rec['dropped_per_step']}, want none")
            compare_runs(f"{name} vs F = 0", rec, ref, 1e-5)
    _, p, _ = run(LAB, 2, short + ["--capacity-factor", "1e9", "--dry-run"])
    rec, _, _ = run(LAB, 2, short + ["--capacity-factor", "1e9"])
    acts = [int(m) for m in __import__("re").findall(r"^ +\d+ +\d+ +\d+ +\d+ +\[\d+,\d+\) +\d+ +\d+ +\d+ +(\d+)",
                                                    p.stdout, __import__("re").M)]
    check(acts == rec["mem_peak_bytes_per_rank"]["acts"],
          f"--capacity-factor 1e9: the dry run predicts activations {acts}, the run allocated "
          f"{rec['mem_peak_bytes_per_rank']['acts']}")
    print(f"--capacity-factor 1e9 and 3e38: no drops in lab08 (both scopes), lab01 and lab02, losses = F = 0's; "
          f"dry run exact (acts {acts})")


def dry_run():
    """--dry-run predicts the run: with a capacity every rank's peak per memory category to the
    byte (the received rows' buffers are sized to its bound); with F = 0 the capacity-free bound,
    which the run stays under. Per step the all-reduce's calls and payload exactly, the
    all-to-all's calls exactly and its payload between the uniform figure and the bound (the
    return rows are the routing's; the busiest rank is recorded, at least the EP group's mean)."""
    import re
    cats = ["params", "grads", "optim", "acts", "comm", "workspace"]
    cases = [(4, ["--ep", "2", "--capacity-factor", "1.0"]), (2, ["--top-k", "1", "--capacity-factor", "1.25"]),
             (3, ["--experts", "3", "--capacity-factor", "1.25", "--recompute", "full"]),
             (4, ["--capacity-factor", "1.0", "--recompute", "selective", "--precision", "bf16"]),
             (4, ["--ep", "1", "--capacity-factor", "2"]), (1, ["--capacity-factor", "1.0"]),
             (2, []), (4, ["--experts", "8", "--recompute", "full"])]
    short = [a if a != "20" else "2" for a in ARGS]
    for n, extra in cases:
        name = f"-n {n} {' '.join(extra)}"
        _, p, _ = run(LAB, n, short + extra + ["--dry-run"])
        rec, _, _ = run(LAB, n, short + extra)
        capped = "--capacity-factor" in extra
        rows = {int(m[0]): [int(x) for x in m[1].split()[:len(cats)]]
                for m in re.findall(r"^ +(\d+) +\d+ +\d+ +\d+ +\[\d+,\d+\) +([\d ]+)$", p.stdout, re.M)}
        check(sorted(rows) == list(range(n)), f"{name}: no memory row per rank in the dry run:\n{p.stdout}")
        for q in range(n):
            got = [rec["mem_peak_bytes_per_rank"][c][q] for c in cats]
            ok = rows[q] == got if capped else all(g <= w for g, w in zip(got, rows[q])) and got[:3] == rows[q][:3]
            check(ok, f"{name}: rank {q} predicted {rows[q]}, allocated {got} ({cats})")
        table = p.stdout.split("traffic per rank")[1].split("\n")[1]
        kinds = {k: (float(c), float(b)) for k, c, b in re.findall(r"(\w+) ([\d.]+) calls, payload (\d+)", table)}
        calls, uniform, most = (float(x) for x in re.search(
            r"and alltoall ([\d.]+) calls, payload (\d+) per rank per step under uniform routing, at most (\d+)",
            p.stdout).groups())
        measured = {k: (rec["comm_calls_per_step"][k], rec["comm_bytes_per_step"][k]) for k in rec["comm_bytes_per_step"]}
        a2a_calls, a2a_bytes = measured.pop("alltoall", (0, 0))
        check(kinds == measured, f"{name}: traffic predicted {kinds}, measured {measured}")
        check(a2a_calls == calls, f"{name}: all-to-all calls predicted {calls}, measured {a2a_calls}")
        low = 0 if capped else uniform  # dropped slots do not travel
        check(low <= a2a_bytes <= most, f"{name}: all-to-all payload {a2a_bytes} outside [{low}, {most}]")
        if not capped:  # dropless: the busiest layer's skew prices every layer above what any rank held
            acts = max(rec["mem_peak_bytes_per_rank"]["acts"])
            skew, at, uni, bound = (rec[k] for k in ("dropless_skew", "dropless_acts_at_skew", "dropless_acts_uniform",
                                                     "dropless_acts_bound"))
            check(skew >= 1 and uni <= at <= bound and acts <= at and rows[0][3] == bound,
                  f"{name}: dropless skew {skew}, activations held {acts}, at the skew {at}, uniform {uni}, "
                  f"bound {bound} (the dry run's {rows[0][3]})")
        print(f"{name}: memory {'exact' if capped else 'under the bound'} {rows[0]}; all-reduce {kinds}; "
              f"all-to-all {a2a_bytes} in [{low:.0f}, {most:.0f}]")


def margin():
    """The smallest top-k margin each step routed on (common/moe.h, moe_min_margin: a token's
    k-th router probability less its (k+1)-th, the least over tokens, layers and ranks): printed
    on every step line as the record holds it, one per step, none when k = E (no (k+1)-th); it
    survives --recompute full (the recomputed router writes the same values), and reading it
    changes nothing (the losses are the ones the equivalence tests hold). What it means: top-k is
    a discontinuous function of the probabilities, so two layouts route alike while every margin
    exceeds their rounding differences; the step where lab08 parts from lab01 (more than 1e-6:
    the layouts' rounding stays near 1e-7) must be a step that routed on a near tie, a margin of
    a few units in the last place of a probability (2e-7). The course's default model, 20 steps at
    F = 1.0 (lab08_ep/part2-routing-margin.md), parted at step 16 on one machine and step 20 on another."""
    short = [a if a != "20" else "4" for a in ARGS] + ["--capacity-factor", "1.0"]
    rec, p, _ = run(LAB, 2, short)
    margins = rec["topk_margin_per_step"]
    check(len(margins) == rec["steps_done"] == 4, f"one margin per step: {margins}")
    check(all(0 <= m < 1 for m in margins), f"margins are gaps of probabilities: {margins}")
    printed = [float(x) for x in re.findall(r"^step \d+/\d+ \|.*\| top-k margin ([\d.e+-]+)$", p.stdout, re.M)]
    check(printed == [float(f"{m:.2e}") for m in margins], f"step lines {printed} != the record's {margins}")
    full, _, _ = run(LAB, 2, short + ["--recompute", "full"])
    check(full["topk_margin_per_step"] == margins and full["losses"] == rec["losses"],
          f"--recompute full: margins {full['topk_margin_per_step']} vs {margins}")
    every, p, _ = run(LAB, 2, short[:-2] + ["--experts", "2", "--top-k", "2"])
    check(every["topk_margin_per_step"] == [] and "top-k margin" not in p.stdout, "k = E: no margin to print")
    # the default model (8 layers, C = 128, batch 32 x 64): near ties come with 2 x 8 x 2048 routed tokens
    course = ["--steps", "20", "--top-k", "2", "--capacity-factor", "1.0"]
    ep, _, _ = run(LAB, 2, course + ["--ep", "2"], timeout=900)
    ref, _, _ = run("lab01_dp", 1, course + ["--experts", "4"], timeout=900)
    diffs = [abs(a - b) / abs(b) for a, b in zip(ep["losses"], ref["losses"])]
    parted = next((i for i, d in enumerate(diffs) if d > 1e-6), None)
    if parted is None:
        print(f"lab08 -n 2 --ep 2 = lab01 -n 1 within {max(diffs):.1e} for 20 steps; smallest margin "
              f"{min(ep['topk_margin_per_step']):.2e}")
    else:
        m = ep["topk_margin_per_step"][parted]
        check(m < 2e-7, f"lab08 parts from lab01 at step {parted + 1} ({diffs[parted]:.1e}) on a margin of {m:.2e}: "
                        f"no near tie explains it")
        print(f"lab08 -n 2 --ep 2 = lab01 -n 1 within {max(diffs[:parted]):.1e} for {parted} steps; at step "
              f"{parted + 1} the losses part by {diffs[parted]:.1e}, on a top-k margin of {m:.2e}")


def deepseek():
    """DeepSeek-V3's routing (--router sigmoid, --balance bias): every layout trains as lab01 -n 1
    does with the same flags: the same drops, the same load imbalance and the same bias every
    step (it moves by the global load, summed over all ranks), losses within 1e-5; lab02 and
    lab04 too; a checkpoint carries the bias, and a resume at another layout goes on exactly."""
    import tempfile
    steps = [a if a != "20" else "10" for a in ARGS]
    for routing in (["--router", "sigmoid", "--balance", "bias", "--bias-speed", "0.01", "--capacity-factor", "1.0"],
                    ["--balance", "bias", "--bias-speed", "0.01"], ["--router", "sigmoid", "--top-k", "1"],
                    # node-limited routing: a token's two experts from one of two groups (a group of EP ranks)
                    ["--router", "sigmoid", "--route-groups", "2", "--route-max-groups", "1"]):
        extra = ["--experts", "4"] + routing
        ref, _, _ = run("lab01_dp", 1, steps + extra)
        bias, groups = "bias" in routing, "--route-groups" in routing
        check(ref["aux_losses"] == [0] * 10 if bias else min(ref["aux_losses"]) > 0,
              f"{routing}: aux losses {ref['aux_losses']}")
        if groups:  # every token of every layer and step reached one group, as M = 1 allows
            check(ref["route_groups_max_per_step"] == [1] * 10 and ref["route_groups_mean_per_step"] == [1] * 10,
                  f"{routing}: groups reached {ref['route_groups_max_per_step']} {ref['route_groups_mean_per_step']}")
        if bias:  # it moved: every step by gamma at most, and it did move
            check(0 < ref["bias_max_per_step"][-1] <= 10 * 0.01 + 1e-6, f"{routing}: bias {ref['bias_max_per_step']}")
        cases = [(LAB, 2, ["--ep", "2"]), (LAB, 4, ["--ep", "4"]), (LAB, 4, ["--ep", "2"]),
                 ("lab02_zero", 2, ["--zero-stage", "2"]), ("lab04_1f1b", 2, ["--micro-batches", "2"])]
        for lab, n, more in cases:
            rec, _, _ = run(lab, n, steps + extra + more)
            name = f"{lab} -n {n} {' '.join(more + routing)}"
            compare_runs(f"{name} vs lab01 -n 1", rec, ref, 1e-5)
            for key in ("dropped_per_step", "load_imbalance_per_step") + (("bias_min_per_step", "bias_max_per_step")
                                                                           if bias else ()) + \
                    (("route_groups_max_per_step", "route_groups_mean_per_step") if groups else ()):
                check(rec[key] == ref[key], f"{name}: {key} {rec[key]} != lab01's {ref[key]}")
            if groups and lab == LAB:
                cross_groups(name, rec)
        print(f"{' '.join(routing)}: load max/mean {ref['load_imbalance_per_step'][0]:.3f} -> "
              f"{ref['load_imbalance_per_step'][-1]:.3f} at every layout")
    # the measure can fail: with M = G = 2 nothing is limited, and tokens do reach both groups
    free, _, _ = run("lab01_dp", 1, steps + ["--experts", "4", "--router", "sigmoid", "--route-groups", "2",
                                             "--route-max-groups", "2"])
    check(max(free["route_groups_max_per_step"]) == 2 and max(free["route_groups_mean_per_step"]) > 1,
          f"M = G: groups reached {free['route_groups_max_per_step']} {free['route_groups_mean_per_step']}")
    print(f"--route-groups 2: M = 1 kept every token in one group; M = 2 let them reach 2 (mean "
          f"{free['route_groups_mean_per_step'][0]:.2f} at step 1)")
    # the case: 8 experts in G = 4 groups (one EP rank each), at most M = 2 groups a token
    limited = steps + ["--experts", "8", "--router", "sigmoid", "--route-groups", "4", "--route-max-groups", "2"]
    ref, _, _ = run("lab01_dp", 1, limited)
    rec, _, _ = run(LAB, 4, limited + ["--ep", "4"])
    compare_runs("lab08 --ep 4, G = 4, M = 2 vs lab01 -n 1", rec, ref, 1e-5)
    check(max(rec["route_groups_max_per_step"]) == 2 and rec["route_groups_max_per_step"] == ref["route_groups_max_per_step"],
          f"G = 4, M = 2: the most groups a token reached per step {rec['route_groups_max_per_step']}")
    cross_groups("lab08 --ep 4, G = 4, M = 2", rec)
    print(f"G = 4, M = 2 at --ep 4: at most {max(rec['route_groups_max_per_step'])} groups a token every step; "
          f"between groups {rec['alltoall_cross_group_per_step'] / 1e6:.2f} MB a row per choice = the routing's, "
          f"{rec['alltoall_cross_group_once_per_step'] / 1e6:.2f} MB once per group")
    # the bias is training state: saved by lab01 after 5 steps, resumed by lab08 at EP 2 x EDP 2
    extra = ["--experts", "4", "--router", "sigmoid", "--balance", "bias", "--bias-speed", "0.01"]
    ref, _, _ = run("lab01_dp", 1, steps + extra)
    ck = os.path.join(tempfile.mkdtemp(prefix="pl-l8ds-"), "ck.safetensors")
    half = [a if a != "10" else "5" for a in steps] + extra
    run("lab01_dp", 1, half + ["--save", ck])
    rec, p, _ = run(LAB, 4, half + ["--ep", "2", "--resume", ck])
    compare_runs("lab08 -n 4 --ep 2 resumed with the bias, steps 6-10 vs lab01", rec, ref, 1e-5, ref_from=5)
    check(rec["bias_max_per_step"] == ref["bias_max_per_step"][5:], "resumed: the bias differs")
    check("resumed with other routing" not in p.stdout, "the same --bias-speed: no change to say")
    # another gamma is allowed (the same bias moves at another rate) and said in one line
    _, p, _ = run(LAB, 2, [a if a != "0.01" else "0.002" for a in half] + ["--ep", "2", "--resume", ck])
    check("resumed with other routing than the checkpoint's: --bias-speed 0.01 -> 0.002" in p.stdout,
          f"a changed --bias-speed is not said: {p.stdout[-400:]}")
    short = [a if a != "10" else "5" for a in steps] + ["--experts", "4"]
    for other, needle in ((["--router", "sigmoid"], "--balance aux"), (["--balance", "bias"], "--router softmax")):
        _, p, _ = run(LAB, 2, short + other + ["--resume", ck], check=False)
        said = p.stdout + p.stderr
        check(p.returncode == 2 and needle in said and "the checkpoint was trained with --router sigmoid --balance "
              "bias" in said, f"resume with {other}: status {p.returncode}, {said[-300:]}")


def cross_groups(name, rec):
    """Node-limited routing over whole EP ranks: the rows the all-to-alls sent between groups (as
    comm was asked to send them) are the routing's (its choices in other groups, out and back), and
    a token's row sent once per group it reaches is no more."""
    cross, routed = rec["alltoall_cross_group_per_step"], rec["alltoall_cross_group_routing_per_step"]
    once = rec["alltoall_cross_group_once_per_step"]
    check(cross > 0 and cross == routed, f"{name}: between groups measured {cross} B, from the routing {routed} B")
    check(0 < once <= cross, f"{name}: once per group {once} B, a row per choice {cross} B")
    steps, once_steps = rec["cross_group_bytes_by_step"], rec["cross_group_once_bytes_by_step"]
    check(len(steps) == len(rec["losses"]) and abs(sum(steps) / len(steps) - cross) <= 1e-9 * cross and
          all(0 < o <= x for o, x in zip(once_steps, steps)),
          f"{name}: per step between groups {steps}, once per group {once_steps}, the run's mean {cross}")


def fine_grained():
    """--expert-width and --shared-experts: DeepSeek-MoE's fine-grained experts, here 8 experts of
    C/2 units (an eighth of the dense MLP's 4C, narrower than d_model as DeepSeek-V3's are) with 2
    shared ones, and 6 of 3C/2 on 3 ranks with 1 shared (the issue's odd case): every layout trains
    as lab01 -n 1 with the same flags (losses and norms within 1e-5, the same drops and loads every
    step), the experts' tensors and the activations as wide (allocator = theory.h), the shared
    experts whole on every EP rank, and a checkpoint refuses another width or shared count."""
    import tempfile
    steps = [a if a != "20" else "10" for a in ARGS]
    for E, M, k, S, cases in ((8, C // 2, 2, 2, [(LAB, 2, ["--ep", "2"]), (LAB, 4, ["--ep", "4"]),
                                                 (LAB, 4, ["--ep", "2"]), ("lab02_zero", 2, ["--zero-stage", "3"]),
                                                 ("lab04_1f1b", 2, ["--micro-batches", "2", "--schedule", "zb-h1"])]),
                              (6, 3 * C // 2, 1, 1, [(LAB, 3, ["--ep", "3"])])):
        extra = ["--experts", str(E), "--expert-width", str(M), "--top-k", str(k), "--capacity-factor", "1.0",
                 "--shared-experts", str(S)]
        ref, _, _ = run("lab01_dp", 1, steps + extra)
        cases = [("lab01_dp", 1, [])] + cases
        check(ref["params"] == params_per_rank(E, 1, M, S), f"E={E} M={M} S={S}: lab01 has {ref['params']} "
              f"parameters, derived {params_per_rank(E, 1, M, S)}")
        check(ref["config"]["expert_width"] == M and ref["config"]["shared_experts"] == S,
              f"the record's config: {ref['config']}")
        check(sum(ref["dropped_per_step"]) > 0, f"E={E} M={M}: F = 1.0 should drop some choices")
        for lab, n, more in cases:
            rec, _, _ = run(lab, n, steps + extra + more)
            name = f"{lab} -n {n} {' '.join(more)} E={E} M={M}"
            compare_runs(f"{name} vs lab01 -n 1", rec, ref, 1e-5)
            for key in ("dropped_per_step", "expert_choices_last_step"):
                check(rec[key] == ref[key], f"{name}: {key} {rec[key]} != lab01's {ref[key]}")
            measured, formula = rec["mem_peak_bytes_per_rank"]["acts"], rec["acts_peak_bytes_formula_per_rank"]
            check(measured == formula, f"{name}: activations measured {measured} != theory.h {formula}")
            if lab in (LAB, "lab01_dp"):  # every category as --dry-run predicts it (a capacity: exact)
                _, dry, _ = run(lab, n, steps + extra + more + ["--dry-run"])
                row = re.search(r"^ +0 +\d+ +\d+ +\d+ +\[[^]]*\) +((?:\d+ +){6})\d+$", dry.stdout, re.M)
                predicted = [int(x) for x in row.group(1).split()] if row else None
                held = [rec["mem_peak_bytes_per_rank"][k][0] for k in ("params", "grads", "optim", "acts", "comm",
                                                                        "workspace")]
                check(predicted == held, f"{name}: rank 0's memory {held} != --dry-run's {predicted}")
            if lab == LAB:
                want = params_per_rank(E, more and int(more[1]) or n, M, S) * 4
                check(rec["mem_peak_bytes_per_rank"]["params"] == [want] * n,
                      f"{name}: parameter bytes per rank {rec['mem_peak_bytes_per_rank']['params']} != {want}")
        print(f"E={E} experts of {M} units (dense {4 * C}), top-{k}, {S} shared: {len(cases) - 1} layouts = "
              f"lab01 -n 1, {sum(ref['dropped_per_step']):.0f} drops")
    # the width is a shape: a checkpoint of one refuses another, in one line naming the flag
    ck = os.path.join(tempfile.mkdtemp(prefix="pl-l8fg-"), "ck.safetensors")
    short = [a if a != "10" else "2" for a in steps] + ["--experts", "4"]
    run("lab01_dp", 1, short + ["--expert-width", str(C), "--save", ck])
    _, p, _ = run(LAB, 2, short + ["--expert-width", str(2 * C), "--resume", ck], check=False)
    said = p.stdout + p.stderr
    check(p.returncode == 2 and f"the checkpoint has --expert-width {C}, the flags say --expert-width {2 * C}" in said,
          f"resume with another width: status {p.returncode}, {said[-300:]}")
    _, p, _ = run(LAB, 2, short + ["--resume", ck], check=False)
    check(p.returncode == 2 and "--expert-width 0" in p.stdout + p.stderr, "resume at the dense width: not refused")
    run("lab01_dp", 1, short + ["--shared-experts", "1", "--save", ck])
    _, p, _ = run(LAB, 2, short + ["--resume", ck], check=False)
    said = p.stdout + p.stderr
    check(p.returncode == 2 and "the checkpoint has --shared-experts 1, the flags say --shared-experts 0" in said,
          f"resume without the shared expert: status {p.returncode}, {said[-300:]}")
    print("a checkpoint of another --expert-width or --shared-experts is refused in one line")


if __name__ == "__main__":
    {"equivalence": equivalence, "sweep": sweep_all, "precision": precision, "resume": resume, "dry_run": dry_run,
     "capacity_scope": capacity_scope, "capacity_limits": capacity_limits, "margin": margin, "deepseek": deepseek,
     "fine_grained": fine_grained}[sys.argv[1]]()
    print("passed")
