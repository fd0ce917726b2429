"""plots/ against its promises: the quick sweep of plots/make_charts.py draws
every chart as a non-empty PNG and SVG, gnuplot says nothing on stderr (no
error, no warning), index.md names every chart, --docs copies every PNG (the
images the lessons embed from docs/charts/, each of which is a chart drawn
here); and each gnuplot script also runs alone on records converted by
plots/records_to_tsv.py, as plots/README.md tells a user to.

usage: test_plots.py quick"""
import glob
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
CHARTS = ["bubble", "timeline", "memory", "acts", "spacts", "throughput", "loss", "precision", "plan", "schedules",
          "comm"]


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


if __name__ == "__main__":
    {"quick": quick}[sys.argv[1]]()
    print("passed")
