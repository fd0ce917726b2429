"""The figures the lessons quote that need runs longer than a transcript's (20 or 50
steps, eight grids): it runs the labs from build/, reads their records and prints the
figures, one table per call. The lessons show its output in ```console long blocks,
which the test lessons_long runs and compares line by line (docs/lesson-shape.md), so
a figure that a code change moves fails a test instead of going stale in the prose.

usage, from build/ (a RUN is one quoted command line without mpirun: "lab05_tp -n 2 --flag ..."):
  python3 ../plots/lesson_tables.py losses --steps S BASE RUN...
      each RUN's loss, first -> last, and its largest relative difference from BASE's over the S
      steps (and at the last step): the losses every lab promises to share with lab01_dp -n 1
  python3 ../plots/lesson_tables.py grids --steps S TxPxD...
      lab06_3d at each grid t x p x d: the traffic per group kind (busiest rank: calls -> bytes),
      parameters and activations per rank, the largest relative loss difference from
      lab01_dp -n 1 over the S steps, and the bubble theory
  python3 ../plots/lesson_tables.py parting --steps S RUN BASE
      step by step: the relative loss difference of RUN from BASE and RUN's smallest top-k margin
      (lab08_ep records it); then the last step's choices per expert where the two differ

Runs are kept in runs/lesson_tables/ (one folder per command line and step count), and a
run of more steps serves a shorter one (the learning rate is constant: step i is step i)."""
import hashlib
import json
import os
import shlex
import subprocess
import sys

MPIRUN = os.environ.get("MPIRUN", "mpirun")
CACHE = os.path.join("runs", "lesson_tables")


def record(cmd, steps):
    """The run record of `mpirun -n N ./lab flags --steps S`, run once (or a longer run's, cut to S steps)."""
    words = shlex.split(cmd)
    lab, n, flags = words[0], words[2], words[3:]
    assert words[1] == "-n", f"a RUN is 'lab -n N flags...', not {cmd!r}"
    key = hashlib.sha1(" ".join(words).encode()).hexdigest()[:16]
    os.makedirs(CACHE, exist_ok=True)
    for name in sorted(os.listdir(CACHE), key=lambda s: -int(s.split("-")[1])):
        if name.startswith(key + "-") and int(name.split("-")[1]) >= steps and \
                os.path.exists(os.path.join(CACHE, name, "records.jsonl")):
            rec = json.loads(open(os.path.join(CACHE, name, "records.jsonl")).read().splitlines()[-1])
            return cut(rec, steps)
    out = os.path.join(CACHE, f"{key}-{steps}")
    argv = [MPIRUN, "-n", n, f"./{lab}", *flags, "--steps", str(steps), "--out", out]
    extra = os.environ.get("PL_LESSON_FLAGS", "")  # the lessons' test runs every lab on the CPU
    argv += shlex.split(extra)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout[-3000:]}")
    return json.loads(open(os.path.join(out, "records.jsonl")).read().splitlines()[-1])


def cut(rec, steps):
    rec = dict(rec)
    for name in ("losses", "topk_margin_per_step", "dropped_per_step"):
        if name in rec:
            rec[name] = rec[name][:steps]
    return rec


def rel_diffs(got, ref):
    return [abs(a - b) / abs(b) for a, b in zip(got, ref)]


def diff_text(d):
    return "0 (bit for bit)" if d == 0 else f"{d:.1e}"


def mb(x):
    return f"{x / 1e6:.2f} MB"


def losses(steps, base, runs):
    ref = record(base, steps)["losses"]
    rows = [("run", "loss", "max rel. diff (step)", "at step " + str(steps))]
    for cmd in runs:
        got = record(cmd, steps)["losses"]
        d = rel_diffs(got, ref)
        worst = max(range(len(d)), key=lambda i: d[i])
        rows.append((cmd, f"{got[0]:.4f} -> {got[-1]:.4f}",
                     diff_text(d[worst]) + ("" if d[worst] == 0 else f" ({worst + 1})"), diff_text(d[-1])))
    print(f"{steps} steps, each run against {base} ({ref[0]:.4f} -> {ref[-1]:.4f}):")
    table(rows)


def grids(steps, layouts):
    ref = record("lab01_dp -n 1", steps)["losses"]
    rows = [("t x p x d", "TP all-reduce", "PP send+recv", "DP all-reduce", "params/rank", "acts/rank",
             "loss vs lab01", "bubble theory")]
    for layout in layouts:
        t, p, d = (int(x) for x in layout.split("x"))
        rec = record(f"lab06_3d -n {t * p * d} --tp {t} --pp {p} --dp {d}", steps)
        cells = [layout]
        for kind, size in (("tp", t), ("pp", p), ("dp", d)):
            g = rec["traffic_per_group"].get(kind)
            if size == 1 or not g:
                cells.append("-")
                continue
            busiest = max(range(len(g["ring_bytes"])), key=lambda r: g["ring_bytes"][r])
            cells.append(f"{g['calls'][busiest]} -> {mb(g['ring_bytes'][busiest])}")
        cells += [mb(rec["mem_peak_bytes"]["params"]), mb(rec["mem_peak_bytes"]["acts"]),
                  diff_text(max(rel_diffs(rec["losses"], ref))),
                  f"{rec['bubble']['theory']:.3f}" if p > 1 else "0"]
        rows.append(cells)
    print(f"lab06_3d, {steps} steps, bytes per rank per step (busiest rank: ring traffic; PP: what it sends and "
          f"receives), MB = 10^6 bytes:")
    table(rows)


def parting(steps, run, base):
    a, b = record(run, steps), record(base, steps)
    d = rel_diffs(a["losses"], b["losses"])
    margins = a.get("topk_margin_per_step", [])
    print(f"A: {run}\nB: {base}")
    rows = [("step", "loss A", "loss B", "rel. diff", "A's top-k margin")]
    for i in range(steps):
        rows.append((str(i + 1), f"{a['losses'][i]:.7f}", f"{b['losses'][i]:.7f}", diff_text(d[i]),
                     f"{margins[i]:.2e}" if i < len(margins) else "-"))
    table(rows)
    E = a["config"].get("experts") or len(a["expert_choices_last_step"]) // a["config"]["layers"]
    moved = [f"layer {i // E + 1} expert {i % E}: {x:.0f} (A) vs {y:.0f} (B)"
             for i, (x, y) in enumerate(zip(a["expert_choices_last_step"], b["expert_choices_last_step"])) if x != y]
    print(f"step {steps}, choices per expert (all ranks) that differ: " + ("; ".join(moved) or "none"))
    print(f"dropped choices per step: {'the same' if a['dropped_per_step'] == b['dropped_per_step'] else 'differ'}")


def table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def main(argv):
    what, steps = argv[0], 20
    args = argv[1:]
    if args[:1] == ["--steps"]:
        steps, args = int(args[1]), args[2:]
    if what == "losses" and len(args) >= 2:
        losses(steps, args[0], args[1:])
    elif what == "grids" and args:
        grids(steps, args)
    elif what == "parting" and len(args) == 2:
        parting(steps, *args)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
