"""lab07_cp against its promises: every context-parallel layout (CP degree x
data parallelism, zig-zag and contiguous chunks, ring, all-gather and Ulysses) trains as
lab01's one-rank run does; the unmasked causal scores each rank computes are
theory/context.c's exact formula (equal on every rank with zig-zag, and with
Ulysses whatever the layout); the K/V (Ulysses: all-to-all) bytes per layer
are the formula's, and the step's ring traffic is the summary's formula; the
activations per rank are the formula derived here and theory/context.c's
(1/N of one rank's for ring and all-gather). GPU-labelled (cuda): the same on
CUDA, the mask's positions in device memory.

usage: test_lab07.py equivalence|precision|resume|dry_run|max_memory|cuda"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import check, check_rejected, compare_runs, run, skip_without_gpu  # noqa: E402

LAB = "lab07_cp"
# odd shapes on purpose: 3 layers, C = 36 (not a multiple of 8), 3 heads
L, C, H, B, T = 3, 36, 3, 4, 48
ARGS = ["--steps", "20", "--layers", str(L), "--d-model", str(C), "--heads", str(H),
        "--batch", str(B), "--seq", str(T)]
# Ulysses splits the heads over the CP ranks: 12 heads (size 3) divide by 1, 2, 3 and 4
H_ULYSSES = 12
ARGS_ULYSSES = ARGS[:ARGS.index("--heads") + 1] + [str(H_ULYSSES)] + ARGS[ARGS.index("--heads") + 2:]


def positions(n, r, zigzag):
    """Rank r's global positions, derived here (not read from the lab)."""
    if not zigzag:
        return list(range(r * T // n, (r + 1) * T // n))
    s = T // (2 * n)
    return list(range(r * s, (r + 1) * s)) + list(range((2 * n - 1 - r) * s, (2 * n - r) * s))


def causal_scores(n, r, zigzag):
    """(query, key) pairs with key <= query over rank r's queries and all T keys."""
    return sum(p + 1 for p in positions(n, r, zigzag))


def kv_bytes_per_layer(algo, n, rows):
    """What one rank sends per layer, forward + backward: b = one rank's K (or V)."""
    b = rows * (T // n) * C * 4
    if n == 1:
        return 0  # the whole sequence on one rank: nothing travels
    if algo == "ulysses":  # all-to-alls of q|k|v and the output, and of their gradients: (N-1)/N leaves
        return 2 * (3 * b + b) * (n - 1) // n
    if algo == "ring":  # K,V N-1 steps forward and again backward; dK,dV N steps home
        return 2 * (n - 1) * b + 2 * (n - 1) * b + 2 * n * b
    return 2 * (n - 1) * b + 4 * (n - 1) * b  # all-gather fwd, again + reduce-scatter bwd


def acts_bytes_per_rank(rows, n, algo="ring", heads=H):
    """The activations one rank allocates, derived here from the shapes (fp32,
    every piece 64-byte aligned): per layer the one-rank layer's pieces on
    rows x T/N positions, with one log-sum-exp per query row and head where the
    attention matrix was; tokens, targets, the layers' input and the head's."""
    def piece(values):
        return (values * 4 + 63) // 64 * 64
    N, V = rows * (T // n), 256
    # att: one fp32 log-sum-exp per query row and head; Ulysses also keeps the
    # head-split q, k, v and output, all T positions of heads/n heads: 4 N C values
    att = N * heads + (4 * N * C if algo == "ulysses" else 0)
    layer = [N * C, N, N, 3 * N * C, N * C, att, N * C, N * C, N, N, 4 * N * C, 4 * N * C, N * C]
    return (2 * piece(N) + piece(N * C) + L * sum(piece(x) for x in layer)
            + piece(N * C) + 2 * piece(N) + 2 * piece(N * V) + piece(N))


def equivalence():
    refs = {H: run("lab01_dp", 1, ARGS)[0], H_ULYSSES: run("lab01_dp", 1, ARGS_ULYSSES)[0]}
    acts = {}
    bitwise = []
    # (ranks, cp): cp = ranks is pure CP; cp < ranks adds data parallelism
    for ranks, cp in ((1, 1), (2, 2), (3, 3), (4, 4), (4, 2), (2, 1)):
        for layout in ("zigzag", "contiguous"):
            for algo in ("ring", "allgather", "ulysses"):
                if cp == 1 and (layout, algo) != ("zigzag", "ring"):
                    continue  # one rank per group: the layouts and algorithms coincide
                heads = H_ULYSSES if algo == "ulysses" else H
                ref = refs[heads]
                name = f"-n {ranks} --cp {cp} {layout} {algo}"
                rec, _, _ = run(LAB, ranks, (ARGS_ULYSSES if algo == "ulysses" else ARGS)
                                + ["--cp", str(cp), "--cp-layout", layout, "--cp-algo", algo])
                # each block's softmax is merged by log-sum-exp (Ulysses: one block
                # kernel over every position, not lab01's matrix) and the gradient
                # summed over DP x CP: another rounding order than lab01's, not
                # bitwise (measured: equal to the printed 4 decimals)
                compare_runs(f"lab07 {name} vs lab01 -n 1", rec, ref, 1e-5)
                if algo != "ring" and rec["losses"] == ref["losses"]:
                    bitwise.append(name)
                check((rec["cp"], rec["dp"]) == (cp, ranks // cp), f"{name}: grid {rec['cp']} x {rec['dp']}")
                zig = layout == "zigzag"
                if algo == "ulysses":  # every position of heads/cp heads: T(T+1)/2/cp per model head
                    want = [T * (T + 1) / 2 / cp] * cp
                else:
                    want = [causal_scores(cp, r, zig) for r in range(cp)]
                check(rec["scores_per_rank"] == want == rec["scores_per_rank_formula"],
                      f"{name}: scores per rank {rec['scores_per_rank']} / formula "
                      f"{rec['scores_per_rank_formula']}, derived here {want}")
                check(sum(want) == T * (T + 1) // 2, f"{name}: the ranks' scores do not add up to the causal T(T+1)/2")
                if zig or algo == "ulysses":
                    check(len(set(want)) == 1, f"{name}: zig-zag and Ulysses should balance the scores: {want}")
                kv = kv_bytes_per_layer(algo, cp, B // (ranks // cp))
                check(rec["cp_bytes_per_layer"] == kv == rec["cp_bytes_per_layer_formula"],
                      f"{name}: {algo} bytes per layer {rec['cp_bytes_per_layer']} / formula "
                      f"{rec['cp_bytes_per_layer_formula']}, derived here {kv}")
                check(abs(rec["comm_ring_bytes_per_step"] - rec["comm_formula_bytes_per_step"]) <= 1,
                      f"{name}: ring traffic {rec['comm_ring_bytes_per_step']} != formula "
                      f"{rec['comm_formula_bytes_per_step']}")
                want_acts = acts_bytes_per_rank(B // (ranks // cp), cp, algo, heads)
                check(rec["mem_peak_bytes_per_rank"]["acts"] == [want_acts] * ranks
                      and rec["acts_peak_bytes_formula_per_rank"] == [want_acts] * ranks,
                      f"{name}: activations per rank {rec['mem_peak_bytes_per_rank']['acts']}, theory/context.c "
                      f"{rec['acts_peak_bytes_formula_per_rank']}, derived here {want_acts}")
                if algo == "ring" and cp > 1:  # the hiding condition from the run's measured rate and bandwidth
                    rows = B // (ranks // cp)
                    flops, msg = 4 * rows * C * want[0] / cp, rows * (T // cp) * 2 * C * 4
                    blk, sec = rec["ring_block_seconds"], rec["ring_message_seconds"]
                    check(rec["ring_flops_per_s"] > 0 and rec["ring_bytes_per_s"] > 0
                          and abs(blk * rec["ring_flops_per_s"] - flops) <= 1e-4 * flops
                          and abs(sec * rec["ring_bytes_per_s"] - msg) <= 1e-4 * msg
                          and rec["ring_hidden"] == (blk >= sec),
                          f"{name}: ring hiding {blk} s block ({flops} FLOPs) vs {sec} s message ({msg} B), "
                          f"hidden {rec['ring_hidden']}")
                print(f"{name}: scores {want}, {kv} B per layer, acts {want_acts} B per rank = the formula")
                if ranks == cp and layout == "zigzag" and algo == "ring":
                    acts[cp] = rec["mem_peak_bytes"]["acts"]
    # every piece is per position (the T x T matrix became an lse per row): 1/N exactly at these shapes
    check(all(acts[n] * n == acts[1] for n in acts), f"activations per rank {acts} are not 1/N of one rank's")
    print(f"bitwise equal to lab01 -n 1 (allgather, ulysses): {bitwise or 'none'}")
    loss = refs[H]["losses"]
    check(loss[-1] < loss[0] - 1.0, f"the loss should fall clearly in 20 steps: {loss[0]:.3f} -> {loss[-1]:.3f}")


def precision():
    """--recompute reproduces --recompute none bit for bit (the same kernels on
    the same inputs, the ring run again); bf16 trains as lab01's bf16 does."""
    base, _, _ = run(LAB, 2, ARGS)
    for mode in ("selective", "full"):
        rec, _, _ = run(LAB, 2, ARGS + ["--recompute", mode])
        check(rec["losses"] == base["losses"], f"--recompute {mode}: losses differ from none")
        check(abs(rec["comm_ring_bytes_per_step"] - rec["comm_formula_bytes_per_step"]) <= 1,
              f"--recompute {mode}: ring traffic {rec['comm_ring_bytes_per_step']} != formula")
        print(f"--recompute {mode}: bit-identical losses; acts {rec['mem_peak_bytes']['acts']} B "
              f"(none: {base['mem_peak_bytes']['acts']} B)")
    ref, _, _ = run("lab01_dp", 1, ARGS + ["--precision", "bf16"])
    rec, _, _ = run(LAB, 2, ARGS + ["--precision", "bf16"])
    compare_runs("lab07 -n 2 bf16 vs lab01 -n 1 bf16", rec, ref, 2e-3)


def resume():
    """--save at cp = 2, --resume at cp = 2 x dp = 2 contiguous and in lab01: a
    whole replica on every rank, so any layout continues the same run."""
    import tempfile
    ck = os.path.join(tempfile.mkdtemp(prefix="pl-l7ck-"), "ck.safetensors")
    ref, _, _ = run("lab01_dp", 1, ARGS)
    half = [a if a != "20" else "10" for a in ARGS]
    first, _, _ = run(LAB, 2, half + ["--save", ck])
    compare_runs("lab07 -n 2 steps 1-10 vs lab01", first, ref, 1e-5, ref_to=10)
    evals = []
    for lab, n, extra in ((LAB, 4, ["--cp", "2", "--cp-layout", "contiguous"]), ("lab01_dp", 1, [])):
        rec, _, _ = run(lab, n, half + extra + ["--resume", ck, "--eval"])
        compare_runs(f"{lab} -n {n} {' '.join(extra)} resumed, steps 11-20 vs lab01", rec, ref, 1e-5, ref_from=10)
        evals.append(rec["eval_loss"])
    # --eval: the held-out loss over the same global tokens, forward only
    check(abs(evals[0] - evals[1]) <= 1e-5 * evals[1], f"--eval: lab07 {evals[0]} vs lab01 {evals[1]}")
    print(f"--eval after resuming: lab07 {evals[0]:.6f}, lab01 {evals[1]:.6f}")


def dry_run():
    """--dry-run predicts the run to the byte: every rank's peak per memory
    category, and per step every kind's calls and payload (Ulysses' all-to-all
    on a line of its own), against what the same flags then measure."""
    import re
    cats = ["params", "grads", "optim", "acts", "comm", "workspace"]
    cases = [(4, ["--cp", "2", "--cp-algo", "ring"]), (4, ["--cp", "2", "--cp-algo", "ring", "--recompute", "selective"]),
             (3, ["--cp-algo", "allgather", "--cp-layout", "contiguous", "--recompute", "full"]),
             (4, ["--cp", "4", "--cp-algo", "ulysses"]), (4, ["--cp", "2", "--cp-algo", "ulysses", "--recompute", "full"]),
             (2, ["--cp-algo", "ulysses", "--precision", "bf16"]), (2, ["--cp", "1", "--cp-algo", "allgather"])]
    short = [a if a != "20" else "2" for a in ARGS_ULYSSES]  # 12 heads: Ulysses at 2, 3 and 4 ranks
    for n, extra in cases:
        name = f"-n {n} {' '.join(extra)}"
        _, p, _ = run(LAB, n, short + extra + ["--dry-run"])
        rec, _, _ = run(LAB, n, short + extra)
        rows = {int(m[0]): [int(x) for x in m[1].split()[:len(cats)]]
                for m in re.findall(r"^ +(\d+) +\d+ +\d+ +\d+ +\[\d+,\d+\) +([\d ]+)$", p.stdout, re.M)}
        check(sorted(rows) == list(range(n)), f"{name}: no memory row per rank in the dry run:\n{p.stdout}")
        for q in range(n):
            got = [rec["mem_peak_bytes_per_rank"][c][q] for c in cats]
            check(rows[q] == got, f"{name}: rank {q} predicted {rows[q]}, allocated {got} ({cats})")
        kinds = {k: (float(c), float(b)) for k, c, b in
                 re.findall(r"(\w+) ([\d.]+) calls, payload (\d+)", p.stdout.split("traffic per rank")[1].split("\n")[1])}
        kinds.update({k: (float(c), float(b)) for k, c, b in re.findall(r"and (alltoall) ([\d.]+) calls, payload (\d+)", p.stdout)})
        measured = {k: (rec["comm_calls_per_step"][k], rec["comm_bytes_per_step"][k]) for k in rec["comm_bytes_per_step"]
                    if rec["comm_bytes_per_step"][k] > 0}
        check(kinds == measured, f"{name}: traffic predicted {kinds}, measured {measured}")
        print(f"{name}: memory {rows[0]} and traffic {kinds} per rank predicted to the byte")


def max_memory():
    """--max-memory-mb: the largest --seq the dry run prints for a group of N
    = 1, 2, 4 ranks grows about linearly with N (the model states, held whole
    by every rank, keep it from exactly N times); a run at that T allocates at
    most the cap on every rank, and the next T it could take (2N more, zig-zag)
    is refused before any work."""
    import re
    cap_mb = 4
    short = [a if a != "20" else "2" for a in ARGS if a not in ("--seq", str(T))]
    largest = {}
    for n in (1, 2, 4):
        flags = short + ["--max-memory-mb", str(cap_mb)]
        _, p, _ = run(LAB, n, flags + ["--dry-run"])
        m = re.search(rf"largest --seq that fits {cap_mb} MiB per rank at cp={n}: (\d+) \(a multiple of {2 * n}\)", p.stdout)
        check(m is not None, f"-n {n}: no largest --seq line in the dry run:\n{p.stdout}")
        t = largest[n] = int(m[1])
        group = re.search(rf"one group of cp ranks \(dp=1\):.* cp={n} (\d+)", p.stdout)
        check(group is not None and int(group[1]) == t, f"-n {n}: the cp={n} figure of the group line differs from {t}")
        rec, _, _ = run(LAB, n, flags + ["--seq", str(t)])
        totals = rec["mem_peak_bytes_per_rank"]["total"]
        sums = [sum(rec["mem_peak_bytes_per_rank"][c][q] for c in ("params", "grads", "optim", "acts", "comm", "workspace"))
                for q in range(n)]
        check(max(totals) <= max(sums) <= cap_mb * 2**20, f"-n {n} --seq {t}: peak per rank {totals}, the sum of the "
              f"categories' peaks {sums}, over the cap {cap_mb * 2**20}")
        check_rejected(LAB, n, flags + ["--seq", str(t + 2 * n)], "--max-memory-mb")
        print(f"-n {n}: largest --seq {t} under {cap_mb} MiB: allocated at most {max(totals)} B per rank; {t + 2 * n} refused")
    check(largest[2] >= 1.8 * largest[1] and largest[4] >= 1.8 * largest[2],
          f"the largest --seq should grow about linearly with the CP group: {largest}")


def cuda():
    """GPU-labelled: every algorithm at 1 and 2 ranks (zig-zag, and contiguous chunks:
    other mask positions on the device) trains on CUDA as lab01 -n 1 on CUDA does
    (1e-5, the layout's bound) and as lab01 on the CPU does (1e-3, cuBLAS's order of
    sums), and moves the formula's bytes; bf16 as lab01's bf16 on CUDA does; skipped
    (77) without a GPU."""
    skip_without_gpu(LAB)
    refs = {(h, dev): run("lab01_dp", 1, args + ["--device", dev])[0]
            for h, args in ((H, ARGS), (H_ULYSSES, ARGS_ULYSSES)) for dev in ("cpu", "cuda")}
    for ranks, layout, algo in [(1, "zigzag", a) for a in ("ring", "allgather", "ulysses")] + \
                               [(2, "zigzag", a) for a in ("ring", "allgather", "ulysses")] + \
                               [(2, "contiguous", "ring"), (2, "contiguous", "ulysses")]:
        heads = H_ULYSSES if algo == "ulysses" else H
        name = f"cuda -n {ranks} {layout} {algo}"
        rec, _, _ = run(LAB, ranks, (ARGS_ULYSSES if algo == "ulysses" else ARGS)
                        + ["--device", "cuda", "--cp-layout", layout, "--cp-algo", algo])
        check(rec["device"] == "cuda" and (rec["cp"], rec["dp"]) == (ranks, 1),
              f"{name}: device {rec['device']}, grid {rec['cp']} x {rec['dp']}")
        compare_runs(f"lab07 {name} vs cuda lab01 -n 1", rec, refs[(heads, "cuda")], 1e-5)
        compare_runs(f"lab07 {name} vs cpu lab01 -n 1", rec, refs[(heads, "cpu")], 1e-3)
        kv = kv_bytes_per_layer(algo, ranks, B)
        check(rec["cp_bytes_per_layer"] == kv == rec["cp_bytes_per_layer_formula"],
              f"{name}: {algo} bytes per layer {rec['cp_bytes_per_layer']} / formula "
              f"{rec['cp_bytes_per_layer_formula']}, derived here {kv}")
    ref, _, _ = run("lab01_dp", 1, ARGS + ["--device", "cuda", "--precision", "bf16"])
    rec, _, _ = run(LAB, 2, ARGS + ["--device", "cuda", "--precision", "bf16"])
    compare_runs("cuda lab07 -n 2 bf16 vs cuda lab01 -n 1 bf16", rec, ref, 2e-3)


if __name__ == "__main__":
    {"equivalence": equivalence, "precision": precision, "resume": resume, "dry_run": dry_run, "max_memory": max_memory,
     "cuda": cuda}[sys.argv[1]]()
    print("passed")
