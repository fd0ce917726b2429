#!/usr/bin/env python3
"""The ideal timeline of a pipeline schedule, from lab04's own lists.

Reads the output of `lab04_1f1b --print-schedule` (one or more schedules, on
stdin or from files), runs each rank's list in order at unit times (a rank's F
of the whole stage takes 1, its B 2 unsplit or 1 split, W 1; a chunk's 1/v of
that; sends free; F waits for the previous stage's F, B for its F and the next
stage's B, W for its B) and writes one row per action:

    schedule  rank  start  end  op  micro_batch  chunk

The makespan it finds is the one `--print-schedule` prints on its `unit times`
line (checked: it stops with an error if not). plots/schedules.gp draws the rows
as a Gantt chart, one panel per schedule.

usage: schedule_gantt.py [FILE...] > schedules.tsv"""
import re
import sys


def parse(text):
    """Every schedule in a --print-schedule output: name, p, v, split?, stages and actions per rank, makespan."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        h = re.match(r"schedule (\S+): (\d+) ranks x (\d+) chunks? \((\d+) virtual stages\), (\d+) micro-batches, (.*)",
                     lines[i])
        if not h:
            i += 1
            continue
        sch = {"name": h[1], "p": int(h[2]), "v": int(h[3]), "S": int(h[4]), "m": int(h[5]),
               "split": h[6].startswith("backward split"), "stages": [], "actions": []}
        for r in range(sch["p"]):
            x = re.match(rf"rank {r} \(stages? ([\d ]+)\): (.*)", lines[i + 1 + r])
            if not x:
                sys.exit(f"schedule_gantt: rank line not understood: {lines[i + 1 + r]!r}")
            sch["stages"].append([int(s) for s in x[1].split()])
            sch["actions"].append([(a[1], int(a[2]), int(a[3] or 0))
                                   for a in re.finditer(r"([FBW])(\d+)(?:\.(\d+))?", x[2])])
        unit = re.search(r"makespan ([\d.]+)", lines[i + 1 + sch["p"]])
        sch["makespan"] = float(unit[1]) if unit else None
        out.append(sch)
        i += 1 + sch["p"]
    return out


def simulate(sch):
    """(rank, start, end, op, micro-batch, chunk) of every action, at unit times."""
    p, v, S = sch["p"], sch["v"], sch["S"]
    dur = {"F": 1 / v, "B": (1 if sch["split"] else 2) / v, "W": 1 / v}
    done, pos, clock, rows = {}, [0] * p, [0.0] * p, []
    left = sum(len(a) for a in sch["actions"])
    while left:
        moved = False
        for r in range(p):
            while pos[r] < len(sch["actions"][r]):
                op, mb, c = sch["actions"][r][pos[r]]
                s = sch["stages"][r][c]
                deps = {"F": [("F", mb, s - 1)] if s > 0 else [],
                        "B": [("F", mb, s)] + ([("B", mb, s + 1)] if s < S - 1 else []),
                        "W": [("B", mb, s)]}[op]
                if any(d not in done for d in deps):
                    break
                start = max([clock[r]] + [done[d] for d in deps])
                clock[r] = done[(op, mb, s)] = start + dur[op]
                rows.append((r, start, clock[r], op, mb, c))
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            sys.exit(f"schedule_gantt: {sch['name']}: the lists wait for each other for ever at {pos}")
    return rows


def main():
    text = "".join(open(f).read() for f in sys.argv[1:]) if sys.argv[1:] else sys.stdin.read()
    schedules = parse(text)
    if not schedules:
        sys.exit("schedule_gantt: no `schedule ...` header in the input (run lab04_1f1b --print-schedule)")
    print("schedule\trank\tstart\tend\top\tmicro_batch\tchunk")
    for sch in schedules:
        rows = simulate(sch)
        span = max(r[2] for r in rows)
        if sch["makespan"] is not None and abs(span - sch["makespan"]) > 1e-6:
            sys.exit(f"schedule_gantt: {sch['name']}: makespan {span}, but --print-schedule says {sch['makespan']}")
        for r, start, end, op, mb, c in rows:
            print(f"{sch['name']}\t{r}\t{start:g}\t{end:g}\t{op}\t{mb}\t{c}")


if __name__ == "__main__":
    main()
