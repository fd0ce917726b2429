"""Draw one step of a pipeline timeline as text: one line per rank, time to the
right, each forward "F3" / backward "B3" / weight half "W3" (micro-batch 3) as
wide as it took, idle time as dots. The same picture Perfetto shows, for a
terminal or a README.

usage: python3 timeline_text.py TIMELINE.csv [STEP] [COLUMNS]
  TIMELINE.csv: the run's timeline (the record's "timeline"; runs/*_timeline.csv)
  STEP: which step to draw [1: the first after the warm-up]; COLUMNS [100]"""
import csv
import sys


def main():
    path = sys.argv[1]
    step = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    width = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    events = [r for r in csv.DictReader(open(path))
              if int(r["step"]) == step and r["kind"] == "compute"]
    if not events:
        sys.exit(f"no compute events of step {step} in {path}")
    t0 = min(float(r["start_us"]) for r in events)
    t1 = max(float(r["end_us"]) for r in events)
    scale = (t1 - t0) / width  # microseconds per column
    ranks = sorted({int(r["rank"]) for r in events})
    print(f"step {step}, {(t1 - t0) / 1e3:.1f} ms, one column = {scale / 1e3:.2f} ms; "
          "F3/B3/W3 = forward/backward/weight half of micro-batch 3, '#' other compute, '.' idle")
    for rank in ranks:
        line = ["."] * width
        for r in events:
            if int(r["rank"]) != rank:
                continue
            a = int((float(r["start_us"]) - t0) / scale)
            b = max(a + 1, int((float(r["end_us"]) - t0) / scale))
            op = r["op"]
            letter = {"forward": "F", "backward": "B", "backward_weight": "W"}.get(op)
            label = letter + r["micro_batch"] if letter else "#"
            text = (label + "-" * width)[: b - a] if label != "#" else "#" * (b - a)
            if len(text) > 1 and label != "#":
                text = text[:-1] + "|"  # mark where the event ends
            line[a:b] = text
        print(f"rank {rank} {''.join(line[:width])}")


if __name__ == "__main__":
    main()
