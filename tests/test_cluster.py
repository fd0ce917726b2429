"""A cluster on one machine: several hosts pretended, and --dry-run.

usage: test_cluster.py dry_run | hosts | hydra

dry_run  every lab's --dry-run exits 0 in under 5 s, creates no --out folder and
         writes nothing into an existing one, prints the placement, and its
         figures are the run's: each rank's memory per category equals what the
         allocator counted in one real run of the same flags (where the dry run
         predicts it), its traffic per kind equals the communicator's count, and
         its formula lines (communication, bubble) equal the ones that run's
         summary printed beside its measurements.
hosts    with the hosts that tests/fake_hosts.c pretends (FAKE_HOSTS_LIB,
         preloaded; PL_FAKE_RANKS_PER_HOST consecutive ranks a host): every lab
         prints one line per host on 2 and on 4 hosts, none on one host; lab06's
         two placement warnings appear exactly when the layout earns them, each
         naming the flags that fix it.
hydra    hosts placed by a real launcher: MPICH's mpiexec (hydra) with its fork
         launcher starts one proxy per name of -hosts on this machine, and MPI
         then counts each proxy's ranks as a host of their own (they share no
         memory segment). So hydra's own placement rules are seen, not
         pretended: a list without counts deals ranks round robin, -ppn and
         host:N counts give consecutive blocks; lab06 warns on the first and
         trains on the second, reproducing lab01 -n 1. Skipped (77) where the
         launcher is not hydra."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import EXPERTS_LAYOUTS, GRAD_ACCUM_LAYOUTS, MPIRUN, check, fail, on_cpu_unless_named, program, run  # noqa: E402

TINY = ["--layers", "2", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "8"]
# every lab at a layout with every kind of traffic it has (lab02 stage 3: buffers and padding)
LAYOUTS = [
    ("lab01_dp", 2, []),
    ("lab02_zero", 2, ["--zero-stage", "3"]),
    ("lab03_pp_naive", 2, []),
    ("lab04_1f1b", 2, ["--micro-batches", "2"]),
    ("lab05_tp", 2, []),
    ("lab06_3d", 4, ["--tp", "2", "--pp", "2", "--dp", "1", "--micro-batches", "2"]),
    # --precision bf16: 2-byte values, 2 + 2 + 12 model states (theory/predict.h's th_run.bf16)
    ("lab02_zero", 2, ["--zero-stage", "3", "--precision", "bf16"]),
    ("lab04_1f1b", 2, ["--micro-batches", "2", "--precision", "bf16"]),
    ("lab06_3d", 4, ["--tp", "2", "--pp", "2", "--dp", "1", "--micro-batches", "2", "--precision", "bf16"]),
    # --experts in every lab that takes them but lab08 (its own test): their parameters, k N slots' buffers,
    # router state and gradients' all-reduce (theory/predict.h)
] + EXPERTS_LAYOUTS + GRAD_ACCUM_LAYOUTS  # lab01's --grad-accum: one micro-batch's activations and scratch
CATEGORIES = ["params", "grads", "optim", "acts", "comm", "workspace"]
DRY_RUN_SECONDS = 5


def launch(lab, n, args, ranks_per_host=0, timeout=120):
    """mpirun -n n ./lab args (on the CPU), optionally on pretended hosts; (process, seconds)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    cmd = [MPIRUN, "-n", str(n)]
    if ranks_per_host:
        # the preloaded library comes before ASan's runtime in the sanitizer build: fine, it only wraps MPI calls
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
        # a pretended host of 1 or 2 ranks "has a core per rank", where waits would spin: not on 2 shared cores
        env["PL_WAIT"] = "polite"
        cmd += ["env", f"LD_PRELOAD={os.environ['FAKE_HOSTS_LIB']}", f"PL_FAKE_RANKS_PER_HOST={ranks_per_host}"]
    cmd += [program(lab), *on_cpu_unless_named(args)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    dt = time.time() - t0
    print(f"$ {' '.join(cmd[3 if not ranks_per_host else 6:])}  ->  status {p.returncode} in {dt:.1f} s", flush=True)
    return p, dt


def parse_dry_run(text):
    """The tables and formula lines of a --dry-run (theory/predict.c, common/run.c)."""
    mem, traffic, formula, bubble = {}, {}, None, None
    part = None
    for line in text.splitlines():
        if line.startswith("  memory per rank"):
            part = "mem"
        elif line.startswith("  traffic per rank"):
            part = "traffic"
        elif not line.startswith("    "):
            part = None
        m = re.match(r"\s+(\d+)\s+\d+\s+\d+\s+\d+\s+(\[\d+,\d+\)|\?)\s+(.*)$", line)
        if part == "mem" and m:
            values = m.group(3).split()
            mem[int(m.group(1))] = [None if v == "?" else int(v) for v in values[:len(CATEGORIES)]]
        m = re.match(r"\s+(\d+)\s+\|(.*)$", line)
        if part == "traffic" and m:
            kinds = {}
            for item in m.group(2).split("|"):
                k = re.match(r"\s*(\w+) (\S+) calls, payload (\d+)", item)
                if k:
                    kinds[k.group(1)] = (None if k.group(2) == "?" else float(k.group(2)), int(k.group(3)))
            traffic[int(m.group(1))] = kinds
        m = re.match(r"  communication   formula (.*) = (\S+B) \((\d+) bytes per rank per step\)", line)
        if m:
            formula = (m.group(1), m.group(2), int(m.group(3)))
        m = re.match(r"  bubble theory   ([\d.]+)", line)
        if m:
            bubble = m.group(1)
    return mem, traffic, formula, bubble


def host_lines(text):
    return [line for line in text.splitlines() if line.startswith("  host ")]


def dry_run():
    worst = 0
    for lab, n, extra in LAYOUTS:
        args = TINY + extra
        out = os.path.join(tempfile.mkdtemp(prefix="pl-dry-"), "never-created")
        p, dt = launch(lab, n, args + ["--dry-run", "--out", out])
        check(p.returncode == 0, f"{lab} --dry-run: status {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-2000:]}")
        check(dt < DRY_RUN_SECONDS, f"{lab} --dry-run took {dt:.1f} s (bound {DRY_RUN_SECONDS} s)")
        worst = max(worst, dt)
        check(not os.path.exists(out), f"{lab} --dry-run created {out}")
        check("step 1/" not in p.stdout, f"{lab} --dry-run trained:\n{p.stdout[-2000:]}")
        hosts = host_lines(p.stdout)
        check(re.search(r"^hosts: 1 ", p.stdout, re.M) and len(hosts) == 1 and f"{n} ranks 0-{n - 1} | cpu" in hosts[0],
              f"{lab} --dry-run: the placement (one host, ranks 0-{n - 1}) is missing:\n{p.stdout}")
        mem, traffic, formula, bubble = parse_dry_run(p.stdout)
        check(sorted(mem) == list(range(n)) and sorted(traffic) == list(range(n)),
              f"{lab} --dry-run: a table row per rank expected:\n{p.stdout}")

        rec, real, _ = run(lab, n, args + ["--steps", "1"])
        # memory: the allocator's peak of every predicted category on every rank
        measured = rec["mem_peak_bytes_per_rank"]
        compared = 0
        for q in range(n):
            for k, cat in enumerate(CATEGORIES):
                if mem[q][k] is None:
                    continue
                check(mem[q][k] == measured[cat][q],
                      f"{lab} rank {q} {cat}: --dry-run says {mem[q][k]}, the run's allocator {measured[cat][q]}")
                compared += 1
        # traffic: per kind, the maximum over ranks, as the record keeps it
        kinds = set(rec["comm_bytes_per_step"]) | {k for t in traffic.values() for k in t}
        for kind in kinds:
            payload = max(t.get(kind, (0, 0))[1] for t in traffic.values())
            calls = [t.get(kind, (0, 0))[0] for t in traffic.values()]
            check(payload == rec["comm_bytes_per_step"].get(kind, 0),
                  f"{lab} {kind}: --dry-run payload {payload}, measured {rec['comm_bytes_per_step'].get(kind, 0)}")
            if None not in calls:
                check(max(calls) == rec["comm_calls_per_step"].get(kind, 0),
                      f"{lab} {kind}: --dry-run {max(calls)} calls, measured {rec['comm_calls_per_step'].get(kind, 0)}")
        # the formula lines: the same figures the summary printed beside its measurements
        check(formula is not None and formula[2] == rec["comm_formula_bytes_per_step"],
              f"{lab}: --dry-run's communication formula {formula}, the run's {rec['comm_formula_bytes_per_step']}")
        summary_formula = re.search(r"formula (.*) = (\S+B); measured", real.stdout)
        check(summary_formula and summary_formula.groups() == formula[:2],
              f"{lab}: the summary's formula line {summary_formula and summary_formula.groups()} differs from "
              f"--dry-run's {formula[:2]}")
        if "bubble" in rec:
            check(bubble == f"{rec['bubble']['theory']:.3f}", f"{lab}: --dry-run bubble theory {bubble}, "
                  f"the run's {rec['bubble']['theory']}")
        # the activation formulas the labs' own lines print (lab03-06's records carry them)
        acts = [mem[q][CATEGORIES.index("acts")] for q in range(n)]
        for key in ("acts_peak_bytes_formula_per_rank",):
            if key in rec and None not in acts:
                want = rec[key] if isinstance(rec[key], list) else [rec[key]] * n
                check(acts[:len(want)] == [int(x) for x in want], f"{lab} {key}: --dry-run {acts}, record {want}")
        print(f"  {lab} -n {n}: {compared} rank-categories = the allocator's, {len(kinds)} kinds = the "
              f"communicator's, formula {formula[2]} bytes = the summary's; {dt:.1f} s", flush=True)

    # an existing --out is left as it was: nothing written into it
    out = tempfile.mkdtemp(prefix="pl-dry-")
    with open(os.path.join(out, "records.jsonl"), "w") as f:
        f.write("{}\n")
    p, _ = launch("lab01_dp", 2, TINY + ["--dry-run", "--out", out])
    check(p.returncode == 0 and os.listdir(out) == ["records.jsonl"] and open(os.path.join(out, "records.jsonl")).read() == "{}\n",
          f"--dry-run changed an existing --out: {os.listdir(out)}")
    # lab01's buckets: the bytes are known, the calls are counted at run time
    p, _ = launch("lab01_dp", 2, TINY + ["--dry-run", "--bucket-mb", "0.01"])
    _, traffic, formula, _ = parse_dry_run(p.stdout)
    check(p.returncode == 0 and traffic[0]["allreduce"][0] is None and formula is not None,
          f"--bucket-mb --dry-run: calls should be '?', bytes and the formula known:\n{p.stdout}")
    print(f"passed: every lab's --dry-run = its run's figures, in at most {worst:.1f} s, nothing written")


def hosts():
    # one host: no per-host lines in a run (the transcripts of the lessons stay as they are)
    rec, p, _ = run("lab01_dp", 2, TINY + ["--steps", "1"])
    check(not host_lines(p.stdout) and "hosts:" not in p.stdout, f"one host printed per-host lines:\n{p.stdout}")
    # 2 and 4 hosts: a real run prints the lines at start-up, before the first step
    for per_host, n_hosts in [(2, 2), (1, 4)]:
        p, _ = launch("lab01_dp", 4, TINY + ["--steps", "1", "--out", tempfile.mkdtemp()], per_host)
        lines = host_lines(p.stdout)
        want = [f"  host host{chr(65 + h)}: {per_host} rank{'s' if per_host > 1 else ''} "
                f"{h * per_host}{'-' + str(h * per_host + per_host - 1) if per_host > 1 else ''} | cpu"
                for h in range(n_hosts)]
        check(p.returncode == 0 and lines == want and f"hosts: {n_hosts} " in p.stdout
              and p.stdout.index("hosts:") < p.stdout.index("step 1/"),
              f"lab01 on {n_hosts} hosts: expected {want} before the first step, got {lines}\n{p.stdout[-2000:]}")
        print(f"  lab01 -n 4 on {n_hosts} hosts: {lines}")
    # every lab, 2 hosts of 2 ranks (dry runs: the lines come from run_setup, shared by all)
    four = ["--layers", "4", "--d-model", "32", "--heads", "4", "--seq", "16", "--batch", "8"]
    for lab, _, _ in LAYOUTS:
        extra = {"lab04_1f1b": ["--micro-batches", "4"], "lab06_3d": ["--tp", "2", "--pp", "2", "--dp", "1"]}
        p, _ = launch(lab, 4, four + extra.get(lab, []) + ["--dry-run"], 2)
        check(p.returncode == 0 and host_lines(p.stdout) == ["  host hostA: 2 ranks 0-1 | cpu", "  host hostB: 2 ranks 2-3 | cpu"],
              f"{lab} on 2 hosts: {host_lines(p.stdout)}\n{p.stdout[-2000:]}{p.stderr[-1000:]}")
    print("  every lab prints one line per host (2 hosts of 2 ranks)")

    # lab06's warnings
    def warnings(text):
        return [line for line in text.splitlines() if line.startswith("warning:")]
    grid = ["--layers", "4", "--d-model", "32", "--heads", "4", "--seq", "16", "--micro-batches", "2", "--dry-run"]
    cases = [  # (ranks per host, ranks, grid flags, expect TP warning, expect PP-inside warning)
        (4, 8, ["--tp", "2", "--pp", "2", "--dp", "2", "--batch", "8"], False, False),  # 2 hosts: TP inside, PP across
        (4, 8, ["--tp", "8", "--pp", "1", "--dp", "1", "--batch", "8", "--heads", "8", "--d-model", "64"], True, False),
        (2, 8, ["--tp", "2", "--pp", "2", "--dp", "2", "--batch", "8"], False, False),  # 4 hosts of one TP group each
        (2, 8, ["--tp", "4", "--pp", "2", "--dp", "1", "--batch", "8"], True, False),   # 4 hosts: TP across, PP across
        (3, 12, ["--tp", "2", "--pp", "6", "--dp", "1", "--batch", "4", "--layers", "6"], True, True),  # 4 hosts of 3
        (3, 8, ["--tp", "2", "--pp", "4", "--dp", "1", "--batch", "4"], True, True),    # 3 hosts of 3, 3, 2
    ]
    for per_host, n, args, want_tp, want_pp in cases:
        p, _ = launch("lab06_3d", n, grid + args, per_host)
        check(p.returncode == 0, f"lab06 {args} on hosts of {per_host}: status {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        w = warnings(p.stdout)
        tp_w = [x for x in w if "TP group of rank" in x]
        pp_w = [x for x in w if "pipeline boundar" in x]
        check(len(w) == len(tp_w) + len(pp_w), f"unexpected warnings: {w}")
        check(bool(tp_w) == want_tp and bool(pp_w) == want_pp,
              f"lab06 {args} on hosts of {per_host}: TP warnings {tp_w}, pipeline warnings {pp_w}; expected "
              f"{want_tp}, {want_pp}")
        t = int(args[args.index("--tp") + 1])
        for x in tp_w:
            if t > per_host:  # no placement fits a group larger than a host: the fix is a smaller --tp
                check(f"--tp {t} is more than the {per_host} ranks of the largest host" in x, f"the fix: {x}")
            else:
                check(f"a multiple of --tp {t} consecutive ranks" in x and "-ppn" in x and "--ntasks-per-node" in x,
                      f"the TP warning must name the fix: {x}")
        for x in pp_w:
            check("--tp that divides every host's rank count" in x and f"multiple of --tp {t} ranks (-ppn)" in x,
                  f"the pipeline warning must name the fix: {x}")
        n_hosts = -(-n // per_host)
        check(len(host_lines(p.stdout)) == n_hosts, f"{n_hosts} host lines expected: {host_lines(p.stdout)}")
        print(f"  lab06 -n {n} {' '.join(args[:6])} on {n_hosts} hosts of {per_host}: {len(tp_w)} TP, {len(pp_w)} "
              f"pipeline warning(s)")
    # the 3 x 3 x 2 case, exactly: ranks 0 and 2 (stages 0 and 1) share hostA while [2 3] crosses A and B
    check("(stages 0 and 1, ranks 0 and 2, both on hostA)" in pp_w[0] and "(3 3 2)" in pp_w[0], pp_w[0])
    print(f"  {pp_w[0]}")
    print("passed")


def hydra_launch(hosts_flags, n, lab, args):
    cmd = [MPIRUN, "-launcher", "fork", *hosts_flags, "-n", str(n), program(lab), *on_cpu_unless_named(args)]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    print(f"$ mpiexec -launcher fork {' '.join(hosts_flags)} -n {n} ./{lab} {' '.join(args)}  ->  status {p.returncode}",
          flush=True)
    return p


def hydra():
    v = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True)
    if "HYDRA" not in v.stdout:
        print(f"{MPIRUN} is not MPICH's hydra: skipped")
        sys.exit(77)
    dry = TINY + ["--dry-run"]
    # no counts: round robin, rank r on host r mod 2
    p = hydra_launch(["-hosts", "localhost,127.0.0.1"], 4, "lab01_dp", dry)
    if p.returncode != 0 or "hosts: 2 " not in p.stdout:
        print(p.stdout[-2000:], p.stderr[-2000:])
        print("hydra's fork launcher did not start two proxies here: skipped")
        sys.exit(77)
    lines = [x.split(":")[1].split("|")[0].strip() for x in host_lines(p.stdout)]
    check(lines == ["2 ranks 0,2", "2 ranks 1,3"], f"-hosts without counts: {lines} (round robin expected)")
    print(f"  -hosts a,b -n 4: {lines}: round robin")
    for flags in (["-hosts", "localhost,127.0.0.1", "-ppn", "2"], ["-hosts", "localhost:2,127.0.0.1:2"]):
        p = hydra_launch(flags, 4, "lab01_dp", dry)
        lines = [x.split(":")[1].split("|")[0].strip() for x in host_lines(p.stdout)]
        check(p.returncode == 0 and lines == ["2 ranks 0-1", "2 ranks 2-3"], f"{flags}: {lines} (blocks of 2 expected)")
        print(f"  {' '.join(flags)} -n 4: {lines}: consecutive")
    # lab06 2 x 2 x 1: round robin splits every TP group; blocks of 2 keep them whole and train as lab01 -n 1
    grid = TINY + ["--tp", "2", "--pp", "2", "--dp", "1", "--micro-batches", "2"]
    p = hydra_launch(["-hosts", "localhost,127.0.0.1"], 4, "lab06_3d", grid + ["--dry-run"])
    w = [x for x in p.stdout.splitlines() if x.startswith("warning:")]
    check(p.returncode == 0 and len(w) == 3 and all("TP group of rank" in x for x in w[:2]), f"round robin: {w}")
    check("stages 0 and 1, ranks 0 and 2" in w[2] and "dealt the ranks round robin" in w[2] and "-ppn N" in w[2]
          and "--distribution=block" in w[2], f"round robin, the pipeline warning and its fix: {w[2]}")
    print(f"  lab06 on round robin: {w[0]}\n  {w[2]}")
    out = tempfile.mkdtemp(prefix="pl-hydra-")
    p = hydra_launch(["-hosts", "localhost:2,127.0.0.1:2"], 4, "lab06_3d", grid + ["--steps", "3", "--out", out])
    check(p.returncode == 0 and "warning" not in p.stdout, f"lab06 on 2 hosts of 2: status {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    with open(os.path.join(out, "records.jsonl")) as f:
        rec = json.loads(f.read().splitlines()[-1])
    check(rec["grid"]["hosts"] == 2 and rec["grid"]["tp_group_spans_hosts"] is False, f"grid {rec['grid']['hosts']} hosts")
    ref, _, _ = run("lab01_dp", 1, TINY + ["--steps", "3"])
    d = max(abs(a - b) / abs(b) for a, b in zip(rec["losses"], ref["losses"]))
    check(len(rec["losses"]) == 3 and d <= 1e-5, f"lab06 across 2 hosts vs lab01 -n 1: {rec['losses']} vs {ref['losses']}")
    print(f"  lab06 2x2x1 on hosts of 2 (TP inside, PP across): losses = lab01 -n 1 within {d:.1e}")
    print("passed")


if __name__ == "__main__":
    {"dry_run": dry_run, "hosts": hosts, "hydra": hydra}[sys.argv[1]]()
