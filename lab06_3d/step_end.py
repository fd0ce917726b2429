"""How one step of lab06 ends, per rank: when its last backward finishes, when
its DP all-reduce runs, when its optimizer starts (ms from the step's start).
Shows which stages' DP all-reduces hide behind other stages' cool-down
backwards and which stand exposed.

usage: python3 step_end.py TIMELINE.csv [STEP]
  TIMELINE.csv: the run's timeline (the record's "timeline"; runs/lab06_3d_*_timeline.csv)
  STEP: which step [1: the first after the warm-up]"""
import csv
import sys


def main():
    path = sys.argv[1]
    step = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    events = {}
    for r in csv.DictReader(open(path)):
        if int(r["step"]) == step:
            events.setdefault(int(r["rank"]), []).append((float(r["start_us"]), float(r["end_us"]), r["op"]))
    if not events:
        sys.exit(f"no events of step {step} in {path}")
    t0 = min(e[0] for ev in events.values() for e in ev)
    print(f"step {step}, ms from its start: last backward ends | DP all-reduce | optimizer starts")
    for rank in sorted(events):
        ev = sorted(events[rank])
        last_bwd = max(e[1] for e in ev if e[2] == "backward")
        # the DP all-reduce is the first all-reduce after the last backward (the
        # TP ones sit inside forwards and backwards)
        dp = [e for e in ev if e[2] == "allreduce" and e[0] >= last_bwd][:1]
        opt = [e for e in ev if e[2] == "optimizer"][:1]
        dp_text = f"{(dp[0][0] - t0) / 1e3:7.1f} - {(dp[0][1] - t0) / 1e3:7.1f}" if dp else "   (none: d = 1)  "
        opt_text = f"{(opt[0][0] - t0) / 1e3:7.1f}" if opt else "?"
        print(f"  rank {rank:2d}: {(last_bwd - t0) / 1e3:7.1f} | {dp_text} | {opt_text}")


if __name__ == "__main__":
    main()
