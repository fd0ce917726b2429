"""plots/ against its promises: the quick sweep of plots/make_charts.py draws
every chart as a non-empty PNG and SVG, gnuplot says nothing on stderr (no
error, no warning), index.md names every chart, --docs copies every PNG (the
images the lessons embed from docs/charts/, each of which is a chart drawn
here); and each gnuplot script also runs alone on records converted by
plots/records_to_tsv.py, as plots/README.md tells a user to.

bad_records: records_to_tsv.py (make plots' reader) on damaged records files
and a diverged run (bad_records' docstring).

usage: test_plots.py quick|bad_records"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import BUILD, MPIRUN, check, fail  # noqa: E402

PLOTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plots")
CHARTS = ["bubble", "timeline", "memory", "acts", "spacts", "cpseq", "epload", "balance", "throughput", "loss", "precision",
          "plan", "schedules", "comm"]


def check_image(path):
    check(os.path.exists(path), f"{path} was not written")
    check(os.path.getsize(path) > 0, f"{path} is empty")
    head = open(path, "rb").read(4096)
    if path.endswith(".png"):
        check(head.startswith(b"\x89PNG"), f"{path} is not a PNG")
    else:
        check(b"<svg" in head, f"{path} is not an SVG")


def gnuplot(script, assigns, cwd):
    cmd = ["gnuplot", "-e", assigns, os.path.join(PLOTS, script)]
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    print(f"$ (cd {cwd} && {' '.join(cmd)}) -> status {p.returncode}")
    check(p.returncode == 0, f"{script}: gnuplot exited {p.returncode}: {p.stderr}")
    check(p.stderr.strip() == "", f"{script}: gnuplot printed on stderr:\n{p.stderr}")


def quick():
    if not shutil.which("gnuplot"):
        fail("gnuplot not found: apt-get install gnuplot-nox")
    out = tempfile.mkdtemp(prefix="pl-plots-")
    docs = os.path.join(out, "docs")
    cmd = [sys.executable, os.path.join(PLOTS, "make_charts.py"), "--quick", "--build", BUILD, "--out", out,
           "--docs", docs, "--mpirun", MPIRUN]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    print(f"$ {' '.join(cmd)} -> status {p.returncode} in {time.time() - t0:.1f} s")
    print(p.stdout[-2500:])
    check(p.returncode == 0, f"make_charts.py exited {p.returncode}:\n{p.stderr[-3000:]}")
    check(re.search(r"\[run +1 of \d+\] \d+:\d\d elapsed, ~\d+:\d\d left", p.stdout) is not None,
          "the driver must print its progress: run i of n, elapsed, estimate left")

    # every chart, both formats, non-empty; gnuplot silent; the index names each
    for name in CHARTS:
        for ext in ("png", "svg"):
            check_image(os.path.join(out, f"{name}.{ext}"))
    log = open(os.path.join(out, "gnuplot.log")).read()
    check(log.strip() == "", f"gnuplot printed errors or warnings:\n{log}")
    index = open(os.path.join(out, "index.md")).read()
    for name in CHARTS:
        check(f"({name}.png)" in index and f"({name}.svg)" in index, f"index.md does not show {name}.png and {name}.svg")
        check(f"plots/{name}.gp" in index, f"index.md does not give the command that drew {name}")
    check(index.count("\n## ") == len(CHARTS), f"index.md should have one section per chart ({len(CHARTS)})")
    check(index.count("| --- |") >= len(CHARTS), "index.md should have a table of numbers per chart")
    print(f"{len(CHARTS)} charts as PNG and SVG, gnuplot silent, index.md names them all")

    # --docs: the lessons' copies, and every image a lesson embeds is one of them
    readme = open(os.path.join(docs, "README.md")).read()
    for name in CHARTS:
        check_image(os.path.join(docs, f"{name}.png"))
        check(f"]({name}.png)" in readme, f"docs README.md does not show {name}.png")
    source = os.path.dirname(PLOTS)
    for lesson in sorted(glob.glob(os.path.join(source, "lab0*", "*.md"))):
        for name in re.findall(r"\]\(\.\./docs/charts/([\w-]+)\.png\)", open(lesson).read()):
            check(name in CHARTS, f"{os.path.relpath(lesson, source)} embeds docs/charts/{name}.png, "
                                  f"which make_charts.py does not draw")
            check_image(os.path.join(source, "docs", "charts", f"{name}.png"))
    print(f"--docs copied the {len(CHARTS)} PNGs; every chart a lesson embeds is drawn by make_charts.py")

    # each script alone, on the user's own data, as plots/README.md says
    mine = tempfile.mkdtemp(prefix="pl-plots-mine-")
    records = sorted(glob.glob(os.path.join(out, "runs", "*", "records.jsonl")))
    merged = os.path.join(mine, "records.jsonl")
    with open(merged, "w") as f:
        for r in records:
            f.write(open(r).read())
    conv = subprocess.run([sys.executable, os.path.join(PLOTS, "records_to_tsv.py"), merged, "--out", mine],
                          capture_output=True, text=True)
    print(conv.stdout, conv.stderr)
    check(conv.returncode == 0, "records_to_tsv.py failed")
    for name in CHARTS:
        if name == "plan":  # plan3d's estimates, not records: make_charts.plan_table writes its table
            sys.path.insert(0, PLOTS)
            sys.dont_write_bytecode = True  # no __pycache__ in plots/
            import make_charts
            check(make_charts.plan_table(BUILD, os.path.join(mine, "plan.tsv")) is not None, "plan3d is not built")
        if name == "schedules":  # lab04's lists, not records: make_charts.schedules_table writes its table
            sys.path.insert(0, PLOTS)
            sys.dont_write_bytecode = True
            import make_charts
            make_charts.schedules_table(BUILD, MPIRUN, os.path.join(mine, "schedules.tsv"))
        if name == "timeline":
            csv = sorted(glob.glob(os.path.join(out, "runs", "pipe", "*pp_4*1f1b_timeline.csv")))[-1]
            gnuplot("timeline.gp", f"src='{csv}'; out='mine_timeline'", mine)
            check_image(os.path.join(mine, "mine_timeline.png"))
            continue
        for fmt in ("png", "svg"):
            gnuplot(f"{name}.gp", f"fmt='{fmt}'", mine)  # the defaults: src NAME.tsv, out NAME
            check_image(os.path.join(mine, f"{name}.{fmt}"))
    print("every script also runs alone on records converted by records_to_tsv.py, without a word on stderr")
    shutil.rmtree(out)
    shutil.rmtree(mine)


def small_runs(out, runs):
    """Tiny lab runs into out/records.jsonl; returns its lines."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    tiny = ["--layers", "2", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "8", "--steps", "3"]
    for lab, n, args in runs:
        cmd = [MPIRUN, "-n", str(n), os.path.join(BUILD, lab), *tiny, *args, "--out", out]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        print(f"$ {' '.join(cmd)} -> status {p.returncode}")
        check(p.returncode == 0, f"{lab}: {p.stdout[-1500:]} {p.stderr[-1500:]}")
    return open(os.path.join(out, "records.jsonl")).read().splitlines()


def to_tsv(args, timeout=10):
    cmd = [sys.executable, os.path.join(PLOTS, "records_to_tsv.py"), *args]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(f"records_to_tsv.py {args}: no answer within {timeout} s (a hang)")
    print(f"$ records_to_tsv.py {' '.join(args)} -> status {p.returncode} in {time.time() - t0:.1f} s: "
          f"{p.stderr.strip()[:300]}")
    return p


def bad_records():
    """records_to_tsv.py (make plots' reader) on records it cannot chart: a
    missing file, a FIFO, a folder, a last line cut short, a line that is not
    JSON or not UTF-8, an empty file, records without what the charts read, an
    --out that is no folder: status 2 within 10 s, one line `error: FILE line
    N: ...`, no traceback, no TSV written, nothing left behind. A diverged run
    (its losses null from the step the loss stopped being finite) is charted:
    its losses are NaN in loss.tsv, gnuplot's undefined point, and loss.gp draws
    them without a word."""
    tmp = tempfile.mkdtemp(prefix="pl-plots-bad-")
    runs = tempfile.mkdtemp(prefix="pl-plots-runs-")
    lines = small_runs(runs, [("lab01_dp", 1, []), ("lab04_1f1b", 2, ["--micro-batches", "2"]),
                              ("lab01_dp", 2, ["--lr", "1e30"])])  # the last one diverges
    base, pipe, diverged = lines

    def file(name, data):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        return path

    def edited(name, i, edit):
        r = json.loads(lines[i])
        edit(r)
        return file(name, "\n".join(lines[:i] + [json.dumps(r)] + lines[i + 1:]) + "\n")

    fifo = os.path.join(tmp, "fifo.jsonl")
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    folder = os.path.join(tmp, "folder.jsonl")
    os.mkdir(folder)
    a_file = file("a-file", "")
    cases = [
        ([os.path.join(tmp, "missing.jsonl")], "missing.jsonl: No such file"),
        ([fifo], "fifo.jsonl: a FIFO"),
        ([folder], "folder.jsonl: a folder"),
        ([file("cut.jsonl", "\n".join(lines) + "\n" + base[:len(base) // 2])], "cut.jsonl line 4: not JSON, the last line cut short"),
        ([file("text.jsonl", base + "\nhello\n" + pipe + "\n")], "text.jsonl line 2: not JSON"),
        ([file("binary.jsonl", b"\xff\xfe\n")], "binary.jsonl line 1: not UTF-8"),
        ([file("empty.jsonl", "")], "empty.jsonl: no records"),
        ([file("nan.jsonl", base.replace('"losses":[', '"losses":[NaN,', 1) + "\n")], "nan.jsonl line 1: not JSON (NaN is not JSON)"),
        ([edited("nolab.jsonl", 0, lambda r: r.pop("lab"))], "nolab.jsonl line 1: lab null"),
        ([edited("nolayout.jsonl", 1, lambda r: r.pop("layout"))], "nolayout.jsonl line 2: layout is missing"),
        ([edited("losses.jsonl", 0, lambda r: r.__setitem__("losses", "5.5"))], "losses.jsonl line 1: losses"),
        ([edited("batch.jsonl", 0, lambda r: r["config"].__setitem__("batch", 0))], "batch.jsonl line 1: config.batch 0"),
        # what only one chart reads: the bubble chart, lab04's measured bubble
        ([edited("bubble.jsonl", 1, lambda r: r["bubble"].pop("measured"))],
         "bubble.jsonl line 2: the bubble chart cannot read it"),
        ([os.path.join(runs, "records.jsonl"), "--out", a_file], "--out"),
        ([os.path.join(runs, "records.jsonl"), "--out", os.path.join(a_file, "sub")], "--out"),
    ]
    made = set(os.listdir(tmp))
    for args, needle in cases:
        out = os.path.join(tmp, "never-created")
        p = to_tsv(args if "--out" in args else args + ["--out", out])
        msgs = p.stderr.strip().splitlines()
        check(p.returncode == 2, f"{args}: status 2 expected, got {p.returncode}: {p.stderr[-1500:]}")
        check(len(msgs) == 1 and msgs[0].startswith("error: ") and needle in msgs[0],
              f"{args}: one line `error: ...` naming {needle!r}, got {msgs}")
        check(p.stdout == "", f"{args}: nothing written before the error: {p.stdout!r}")
        check(not os.path.exists(out), f"{args}: {out} was created")
        check(set(os.listdir(tmp)) == made, f"{args}: left behind {sorted(set(os.listdir(tmp)) - made)}")
        check(os.path.getsize(a_file) == 0, "--out a file: the file was changed")
    print(f"{len(cases)} bad records files refused: status 2, one line, no traceback, nothing written")

    # the diverged run: null losses from its second step, NaN in loss.tsv, drawn silently
    losses = json.loads(diverged)["losses"]
    check(losses[0] is not None and all(x is None for x in losses[1:]), f"lab01 --lr 1e30 diverges: {losses}")
    out = tempfile.mkdtemp(prefix="pl-plots-diverged-")
    p = to_tsv([os.path.join(runs, "records.jsonl"), "--out", out])
    check(p.returncode == 0, f"records with a diverged run: status {p.returncode}: {p.stderr}")
    rows = [l.split("\t") for l in open(os.path.join(out, "loss.tsv")) if not l.startswith("#")]
    column = rows[0].index("lab01 dp=2")
    check([r[column].strip() for r in rows[2:]] == ["NaN"] * (len(losses) - 1) and float(rows[1][column]) == losses[0],
          f"the diverged run's losses in loss.tsv: {[r[column] for r in rows]}")
    check(not any("None" in r for row in rows for r in row), "no None in loss.tsv")
    gnuplot("loss.gp", "fmt='png'", out)
    check_image(os.path.join(out, "loss.png"))
    print("a diverged run's null losses are NaN in loss.tsv; loss.gp draws them without a word on stderr")
    for d in (tmp, runs, out):
        shutil.rmtree(d)


if __name__ == "__main__":
    {"quick": quick, "bad_records": bad_records}[sys.argv[1]]()
    print("passed")
