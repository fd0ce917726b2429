"""--sample (every lab, common/sample.c): the model writes the same text at every
layout as lab01 -n 1, before training and after it, greedy and at a temperature;
the text is printed and recorded, training changes it, and the sample's bytes stay
out of the run's memory peaks.

usage: test_sample.py layouts|temperature"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import check, fail, run  # noqa: E402

SHAPE = ["--layers", "4", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "16", "--steps", "20"]
N = 48


def sample_of(lab, n, args, what):
    rec, p, _ = run(lab, n, SHAPE + ["--sample", str(N)] + args)
    s = rec["sample"]
    check(s["steps"] == [0, 20] and len(s["texts"]) == 2, f"{what}: the record's sample {s}")
    printed = [l for l in p.stdout.splitlines() if l.startswith("sample after ")]
    check(len(printed) == 2 and all(l.endswith(": " + t) for l, t in zip(printed, s["texts"])),
          f"{what}: the printed samples {printed} are not the recorded {s['texts']}")
    return rec, s["texts"]


def layouts():
    ref, want = sample_of("lab01_dp", 1, [], "lab01 -n 1")
    check(want[0] != want[1], f"training did not change the sample: {want[0]!r}")
    plain, _, _ = run("lab01_dp", 1, SHAPE)
    check(plain["mem_peak_bytes"] == ref["mem_peak_bytes"],
          f"--sample changed the run's memory peaks: {plain['mem_peak_bytes']} vs {ref['mem_peak_bytes']}")
    for lab, n, args in (("lab01_dp", 2, []), ("lab02_zero", 2, ["--zero-stage", "3"]),
                         ("lab04_1f1b", 4, []), ("lab04_1f1b", 2, ["--schedule", "zb-v"]),
                         ("lab04_1f1b", 2, ["--schedule", "interleaved"]),
                         ("lab06_3d", 8, []), ("lab06_3d", 4, ["--tp", "2", "--pp", "2", "--dp", "1"]),
                         ("lab09_5d", 8, []), ("lab09_5d", 4, ["--tp", "1", "--cp", "2", "--pp", "2"])):
        what = f"{lab} -n {n} {' '.join(args)}"
        _, got = sample_of(lab, n, args, what)
        if got != want:
            fail(f"{what} wrote {got}, lab01 -n 1 wrote {want}")
        print(f"{what}: the same {N} bytes as lab01 -n 1, before and after training")


def temperature():
    args = ["--temperature", "0.8", "--prompt", "the dog "]
    _, want = sample_of("lab01_dp", 1, args, "lab01 -n 1 at temperature 0.8")
    _, greedy = sample_of("lab01_dp", 1, ["--prompt", "the dog "], "lab01 -n 1 greedy")
    check(want != greedy, "a temperature of 0.8 wrote the greedy text")
    for lab, n in (("lab04_1f1b", 4), ("lab06_3d", 8)):
        _, got = sample_of(lab, n, args, f"{lab} -n {n} at temperature 0.8")
        check(got == want, f"{lab} -n {n} at temperature 0.8 wrote {got}, lab01 -n 1 wrote {want}")
    print(f"temperature 0.8, seeded: lab04 and lab06 write lab01's {N} bytes")


if __name__ == "__main__":
    {"layouts": layouts, "temperature": temperature}[sys.argv[1]]()
    print("passed")
