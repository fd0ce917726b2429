"""The lessons against the programs (docs/lesson-shape.md describes the markup).

static: every lesson has the shape of docs/lesson-shape.md (its sections, one
  answer per exercise), its links and images exist, no lesson points outside the
  repository or quotes the untranslated notes, the README's first command is the
  course's promise.
run LESSON...: in a scratch copy of the build folder (the folder every lesson's
  commands run from), every `mpirun` line of the lesson's "What to run" blocks
  runs with `--steps 1` added (it must exit 0), and every ```console block runs
  as written: each `$ command` must print what the block shows under it. Times,
  rates and time fractions are the machine's and are masked on both sides; a
  line `...` stands for any number of lines, a `…` inside a line for any text.
  A block opened with ```console this-machine only has to run. A block opened with
  ```console long (runs of many steps, sweeps: plots/lesson_tables.py) is left to `long`.
long: every lesson's ```console long blocks, checked as above (the test lessons_long).

usage: test_lessons.py static | run LESSON.md|LAB_FOLDER... | long [LESSON.md|LAB_FOLDER...]  (a folder: its README.md and part files)"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import BUILD, MPIRUN, check, fail  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB_DIRS = sorted(d for d in os.listdir(SOURCE) if re.fullmatch(r"lab0\d_\w+", d)
                  and os.path.exists(os.path.join(SOURCE, d, "README.md")))


def lab_files(lab):
    """A lab's lesson files in reading order: README.md (part 1), then partN-*.md."""
    parts = [f for f in os.listdir(os.path.join(SOURCE, lab)) if re.fullmatch(r"part\d+-[\w-]+\.md", f)]
    return [f"{lab}/README.md"] + [f"{lab}/{f}" for f in sorted(parts, key=lambda f: int(re.match(r"part(\d+)", f)[1]))]


LESSONS = ["README.md"] + [f for lab in LAB_DIRS for f in lab_files(lab)]
MAX_WORDS = 4000  # one sitting: a lesson file over this is split into part files
README_MAX_WORDS = 2000  # the top README: what the course is, the commands, the map, links
# the shape of a lab's lesson: these sections, in this order (others may come between)
SECTIONS = ["The idea", "What the code adds", "What to run", "What to look at", "Exercises", "Answers",
            "Further reading"]


# ---- reading a lesson ----------------------------------------------------------

def blocks(path):
    """(heading, info string, lines, first line number) of every fenced block, in order;
    the heading is the last `## ` heading above the block."""
    out, heading, fence, body = [], "", None, []
    for no, line in enumerate(open(os.path.join(SOURCE, path)), 1):
        line = line.rstrip("\n")
        m = re.match(r"^( *)(```+)(.*)$", line)
        if fence is None:
            if m:
                fence, indent, info, start = m.group(2), len(m.group(1)), m.group(3).strip(), no
                body = []
            elif line.startswith("## "):
                heading = re.sub(r"^Part \d+: ", "", line[3:].strip())
        elif m and m.group(2) == fence and not m.group(3).strip():
            out.append((heading, info, body, start))
            fence = None
        else:
            body.append(line[indent:] if line[:indent].strip() == "" else line)
    check(fence is None, f"{path}: a code block opened at line {start} is never closed")
    return out


def transcripts(path, long=False):
    """(commands and their shown output, run only?, line number) of every ```console block
    (long: of every ```console long block instead)."""
    out = []
    for heading, info, body, start in blocks(path):
        words = info.split()
        if not words or words[0] != "console" or ("long" in words[1:]) != long:
            continue
        steps, cur = [], None
        for line in body:
            if line.startswith("$ "):
                cur = (line[2:].strip(), [])
                steps.append(cur)
            elif cur is None:
                fail(f"{path}:{start}: a console block must start with a `$ command` line")
            else:
                cur[1].append(line)
        out.append((steps, "this-machine" in words[1:], start))
    return out


def run_blocks(path):
    """The `mpirun` lines of the "What to run" blocks (```sh, or no info string)."""
    cmds = []
    for heading, info, body, start in blocks(path):
        if heading.startswith("What to run") and info.split()[:1] in ([], ["sh"]):
            cmds += [l.split("#")[0].strip() for l in body if l.strip().startswith("mpirun")]
    return cmds


# ---- static checks ---------------------------------------------------------------

def static():
    problems = []
    readme = open(os.path.join(SOURCE, "README.md")).read()
    first = re.search(r"```\n(.*?)\n```", readme, re.S).group(1).splitlines()[0]
    if not first.endswith("cd build && make lab04 && mpirun -n 4 ./lab04_1f1b"):
        problems.append(f"README.md: the first command must end with the course's promise "
                        f"`cd build && make lab04 && mpirun -n 4 ./lab04_1f1b`, not: {first}")
    docs = [f"docs/{f}" for f in os.listdir(os.path.join(SOURCE, "docs")) if f.endswith(".md")]
    for path in LESSONS:  # one sitting per file: prose and transcripts, words as `wc -w` counts them
        words = len(open(os.path.join(SOURCE, path)).read().split())
        limit = README_MAX_WORDS if path == "README.md" else MAX_WORDS
        print(f"{words:6d} words  {path}")
        if words > limit:
            problems.append(f"{path}: {words} words, over the {limit} of one sitting (split it into part files)")
    for lab in LAB_DIRS:
        files = lab_files(lab)
        if not lab.startswith("lab00") and not any(
                "](../docs/charts/" in open(os.path.join(SOURCE, f)).read() for f in files):
            problems.append(f"{lab}: shows no chart from docs/charts/ (make plots draws them)")
        for here, there in zip(files, files[1:]):  # the parts are linked in order
            if f"]({os.path.basename(there)})" not in open(os.path.join(SOURCE, here)).read():
                problems.append(f"{here}: does not link to the next part, {os.path.basename(there)}")
    problems += reading_chain()
    problems += unchecked_figures()
    for path in LESSONS + docs + ["plots/README.md"]:
        text = open(os.path.join(SOURCE, path)).read()
        here = os.path.dirname(path)
        if re.search(r"[\u3000-\u9fff\uff00-\uffef]", text):
            problems.append(f"{path}: untranslated text from the notes (paraphrase it in English)")
        if re.search(r"\bseed/|\.\./shared|/work/", text):
            problems.append(f"{path}: points at files outside the repository (seed/, ../shared, /work)")
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))  # links in code are examples
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file = os.path.normpath(os.path.join(SOURCE, here, target.split("#")[0]))
            if not os.path.exists(file):
                problems.append(f"{path}: link to {target}, which does not exist")
            elif "#" in target and target.split("#")[1] not in anchors(file):
                problems.append(f"{path}: link to {target}: no such heading there")
        for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", prose):  # every picture opens as what it claims
            file = os.path.normpath(os.path.join(SOURCE, here, image))
            if os.path.exists(file) and not picture_ok(file):
                problems.append(f"{path}: picture {image} is empty or not a PNG/SVG")
        if path.startswith("lab0") and path != "lab00_concepts/README.md":
            heads = [re.sub(r"^Part \d+: ", "", h) for h in re.findall(r"^## (.+)$", text, re.M)]
            at = 0
            for want in SECTIONS:
                hit = [i for i, h in enumerate(heads) if h.startswith(want) and i >= at]
                if not hit:
                    problems.append(f"{path}: no section `## {want}` (in the order {SECTIONS})")
                else:
                    at = hit[0]
        if path.startswith("lab0"):
            ex = section(text, "Exercises")
            ans = section(text, "Answers")
            n_ex = len(re.findall(r"^\d+\. ", ex, re.M))
            n_ans = len(re.findall(r"^\d+\. ", ans, re.M))
            if n_ex == 0 or n_ex != n_ans:
                problems.append(f"{path}: {n_ex} exercises but {n_ans} answers (one answer per exercise)")
            if ans and "<details>" not in ans:
                problems.append(f"{path}: the answers are not in a collapsed <details> section")
    for p in problems:
        print("FAIL:", p)
    check(not problems, f"{len(problems)} problems in the lessons")
    print(f"{len(LESSONS)} lessons and {len(docs)} docs: shape, links, answers and the first command as promised")


def next_link(path):
    """The target of the last `Next: [...](target)` line of a lesson (relative to the repository), or None."""
    hits = re.findall(r"^Next: \[[^\]]*\]\(([^)#\s]+)[^)]*\)", open(os.path.join(SOURCE, path)).read(), re.M)
    return os.path.relpath(os.path.normpath(os.path.join(SOURCE, os.path.dirname(path), hits[-1])), SOURCE) \
        if hits else None


CLOSING = "docs/closing.md"


def reading_chain():
    """A student who follows the Next links from lab00 reads every lesson file once, in the labs'
    order, and arrives at docs/closing.md, whose Previous link points back at the last one."""
    problems, chain, path = [], [], "lab00_concepts/README.md"
    while path != CLOSING:
        if path in chain or path not in LESSONS:
            problems.append(f"reading chain: {chain[-1] if chain else path} links to {path}, "
                            f"{'read already' if path in chain else 'not a lesson'}")
            return problems
        chain.append(path)
        nxt = next_link(path)
        if nxt is None:
            problems.append(f"{path}: no `Next: [...](...)` line: the reading chain stops there "
                            f"before {CLOSING}")
            return problems
        path = nxt
    want = [f for lab in LAB_DIRS for f in lab_files(lab)]
    if chain != want:
        problems.append(f"reading chain: the Next links visit {chain}, not every lesson file in order {want}")
    closing = open(os.path.join(SOURCE, CLOSING)).read()
    back = re.search(r"Previous:\s*\[[^\]]*\]\(([^)#\s]+)", closing)
    if not back or os.path.relpath(os.path.normpath(os.path.join(SOURCE, "docs", back.group(1))), SOURCE) != chain[-1]:
        problems.append(f"{CLOSING}: its Previous link must point at the last lesson, {chain[-1]}")
    return problems


MEASURED = re.compile(r"(?<![\w.])\d\.\d+e[-+]\d+\b")  # a measured difference, 1.4e-7 (a bound is written 1e-5)


def unchecked_figures():
    """Every measured difference the prose of a lesson quotes (a figure like 1.4e-7 or 6.6e-07:
    loss differences, rounding) is printed by a checked transcript of the same file (```console,
    or ```console long: plots/lesson_tables.py), so a code change that moves it fails a test."""
    problems = []
    for path in LESSONS:
        text = open(os.path.join(SOURCE, path)).read()
        shown = {float(x) for steps, _, _ in transcripts(path) + transcripts(path, long=True)
                 for _, out in steps for line in out for x in MEASURED.findall(line)}
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
        for x in MEASURED.findall(prose):
            if float(x) not in shown:
                problems.append(f"{path}: the measured figure {x} is in no checked transcript of the file "
                                f"(show the run that prints it in a ```console or ```console long block)")
    return problems


def picture_ok(file):
    """A PNG with its signature and a size, or an SVG whose text holds an <svg> element with something drawn."""
    data = open(file, "rb").read()
    if file.endswith(".png"):
        return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    if file.endswith(".svg"):
        text = data.decode("utf-8", "replace")
        return "<svg" in text and "</svg>" in text and len(re.findall(r"<(rect|path|text|line|polygon)\b", text)) > 3
    return len(data) > 0


def anchors(file):
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces to -)."""
    if not file.endswith(".md"):
        return set()
    text = re.sub(r"```.*?```", "", open(file).read(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def section(text, name):
    """The text of every `## name...` section (up to the next `## `)."""
    parts = [re.sub(r"^Part \d+: ", "", p) for p in re.split(r"^## ", text, flags=re.M)]
    return "\n".join(p for p in parts if p.startswith(name))


# ---- running the commands --------------------------------------------------------

MASKS = [  # the machine's figures: never compared
    (re.compile(r"\d+(\.\d+)?[kMG]? ?(tok/s|FLOP/s)"), "<rate>"),
    (re.compile(r"\d+(\.\d+)? ?(ms|us|s)\b"), "<time>"),
    (re.compile(r"\b(compute|comm|bubble) \d\.\d+"), r"\1 <fraction>"),
    (re.compile(r"\b(bubble rank \d+) \d\.\d+"), r"\1 <fraction>"),
    (re.compile(r"\d+\.\d+ / \d+\.\d+ / \d+\.\d+\s*$"), "<times>"),
]


def normalise(line):
    for pattern, repl in MASKS:
        line = pattern.sub(repl, line)
    return " ".join(line.split())


def line_matches(shown, actual):
    pieces = [re.escape(p) for p in normalise(shown).split("…")]
    return re.fullmatch(".*".join(pieces), normalise(actual)) is not None


def output_matches(shown, actual):
    """doctest-like: every shown line matches one actual line, in order; `...` any lines."""
    shown = [l for l in shown if l.strip() != ""]
    actual = [l for l in actual if l.strip() != ""]

    def match(i, j):
        if i == len(shown):
            return j == len(actual)
        if shown[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and line_matches(shown[i], actual[j]) and match(i + 1, j + 1)
    return match(0, 0)


def first_mismatch(shown, actual):
    want = [normalise(l) for l in shown if l.strip() and l.strip() != "..."]
    got = [normalise(l) for l in actual if l.strip()]
    for w in want:
        if not any(line_matches(w, g) for g in got):
            return w
    return "(the lines are there, but not in the order or not all, as shown)"


def on_cpu(cmd):
    """`--device cpu` on each lab program: the transcripts are CPU runs, also on a GPU machine."""
    return re.sub(r"(?<![\w./])(\./lab0\d_\w+)(?![\w/])((?:[ \t]+(?!\d?>)[^\s;|&]+)*)", r"\1\2 --device cpu", cmd)


class Scratch:
    """A scratch build folder: the programs (the labs, plan3d) and tests/ of the build, the repository's
    folders beside it (so ../lab04_1f1b/... works), runs/ of its own, mpirun on PATH."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="pl-lessons-")
        self.build = os.path.join(self.root, "build")
        os.makedirs(self.build)
        for name in os.listdir(BUILD):
            full = os.path.join(BUILD, name)
            if name == "tests" or (name.startswith(("lab", "plan3d")) and os.access(full, os.X_OK)
                                   and os.path.isfile(full)):
                os.symlink(full, os.path.join(self.build, name))
        for name in os.listdir(SOURCE):
            if os.path.isdir(os.path.join(SOURCE, name)) and not name.startswith((".", "build")):
                os.symlink(os.path.join(SOURCE, name), os.path.join(self.root, name))
        bindir = os.path.join(self.root, "bin")
        os.makedirs(bindir)
        wrapper = os.path.join(bindir, "mpirun")  # a script, not a link: hydra finds its proxy beside argv[0]
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nexec {shlex.quote(shutil_which(MPIRUN))} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PATH=bindir + os.pathsep + os.environ["PATH"],
                        PL_LESSON_FLAGS="--device cpu")  # plots/lesson_tables.py's runs, on the CPU too
        # the lab06 lesson preloads tests/liblab06_fake_hosts.so; under ASan it comes first
        self.env["ASAN_OPTIONS"] = ":".join(filter(None, [self.env.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
        self.cache = {}

    def sh(self, cmd, timeout=300):
        """Run one command line from the scratch build folder: (status, output lines, seconds).
        A lab run piped into a filter (`mpirun ... | grep ...`) runs once per distinct
        `mpirun ...` part; later filters read its saved output."""
        cmd = on_cpu(cmd)
        head, bar, rest = cmd.partition(" | ")
        if not (head.startswith("mpirun") and not re.search(r"[;&]", head)):
            head, rest = cmd, ""
        t0 = time.time()
        if head not in self.cache:
            self.cache[head] = self._bash(head, None, timeout)
        status, out = self.cache[head]
        if rest and status == 0:
            status, out = self._bash(rest, out, timeout)
        return status, out.splitlines(), time.time() - t0

    def _bash(self, cmd, stdin, timeout):
        try:
            p = subprocess.run(["bash", "-c", cmd], cwd=self.build, env=self.env, input=stdin,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
            return p.returncode, p.stdout
        except subprocess.TimeoutExpired:
            return "timeout", ""


def check_transcripts(scratch, path, blocks_of_file, problems, counts, timeout=300):
    """Run every command of the transcripts and compare what it prints; counts: [commands, lines matched]."""
    for steps, run_only, start in blocks_of_file:
        for cmd, shown in steps:
            status, out, dt = scratch.sh(cmd, timeout)
            counts[0] += 1
            print(f"{path}:{start} $ {cmd}  ->  status {status} in {dt:.1f} s", flush=True)
            if status != 0:
                problems.append(f"{path}:{start}: `{cmd}` exited {status}:\n" + "\n".join(out[-15:]))
            elif not run_only and not output_matches(shown, out):
                problems.append(f"{path}:{start}: `{cmd}` does not print what the lesson shows; first line "
                                f"not found: {first_mismatch(shown, out)!r}\n--- it printed:\n" + "\n".join(out))
            else:
                counts[1] += 0 if run_only else len([l for l in shown if l.strip() not in ("", "...")])


def shutil_which(name):
    found = name if os.path.isabs(name) else shutil.which(name)
    check(found is not None, f"{name} not found")
    return found


def without_steps(cmd):
    return " ".join(re.sub(r"--steps \d+", "", cmd).split())


def run(paths, long=False):
    """Each lesson's commands and transcripts (long: only its ```console long transcripts)."""
    paths = [os.path.relpath(os.path.abspath(p), SOURCE) for p in paths]
    paths = [f for p in paths for f in (lab_files(p) if os.path.isdir(os.path.join(SOURCE, p)) else [p])]
    scratch = Scratch()
    problems, n_cmds, n_lines, t_all = [], 0, 0, time.time()
    for path in paths:
        if long:
            counts = [0, 0]
            check_transcripts(scratch, path, transcripts(path, long=True), problems, counts, timeout=3600)
            n_cmds, n_lines = n_cmds + counts[0], n_lines + counts[1]
            continue
        # a transcript that runs the same command (at its own --steps) covers a "What to run" line
        covered = {without_steps(cmd.partition(" | ")[0]) for steps, _, _ in transcripts(path) for cmd, _ in steps}
        for cmd in run_blocks(path):
            if without_steps(cmd) in covered:
                print(f"{path} (what to run) $ {cmd}  ->  run by a transcript", flush=True)
                continue
            status, out, dt = scratch.sh(cmd + " --steps 1")
            n_cmds += 1
            print(f"{path} (what to run) $ {cmd} --steps 1  ->  status {status} in {dt:.1f} s", flush=True)
            if status != 0:
                problems.append(f"{path}: `{cmd}` (with --steps 1) exited {status}:\n" + "\n".join(out[-15:]))
        counts = [0, 0]
        check_transcripts(scratch, path, transcripts(path), problems, counts)
        n_cmds, n_lines = n_cmds + counts[0], n_lines + counts[1]
    for p in problems:
        print("FAIL:", p, flush=True)
    if problems:
        fail(f"{len(problems)} lesson claims do not hold (the runs' files are in {scratch.build})")
    shutil.rmtree(scratch.root)
    print(f"{' '.join(paths)}: {n_cmds} commands ran, {n_lines} shown lines match, in {time.time() - t_all:.1f} s")


if __name__ == "__main__":
    if sys.argv[1] == "static":
        static()
    elif sys.argv[1] == "run":
        run(sys.argv[2:])
    elif sys.argv[1] == "long":
        run(sys.argv[2:] or [os.path.join(SOURCE, d) for d in LAB_DIRS], long=True)
    else:
        fail(__doc__)
    print("passed")
