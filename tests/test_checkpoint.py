"""Checkpoints and failures, across the labs.

  resume     every lab: 20 steps straight == 10 steps, save, resume, 10 steps, bit
             for bit (losses and the final checkpoint); a checkpoint saved at one
             layout resumes at others within 1e-5 of lab01 -n 1; --eval is the same
             whatever the layout and leaves the training figures alone
  resume_lab06
             the same for lab06 at t x p x d = 2 x 2 x 1, its checkpoint continued
             by lab01 -n 1, lab02 --zero-stage 3 -n 2 and lab06 at 1 x 2 x 2 (also
             with --zero-stage 1: the moments sharded over DP); a
             lab06 checkpoint with other --layers / --d-model flags is refused
  format     the file is plain safetensors: the header parses with json, the tensor
             names, shapes and offsets are the documented ones, the checksum is format
             2's FNV-1a of the metadata and the data, and the parameters are lab01's
             --dump-weights; a format 1 file (checksum of the data alone) still resumes
  refused    truncated, corrupted, mismatched and non-checkpoint files, an edited
             header, a large file that is no checkpoint: status 2 on every rank, one
             line naming the file, within 5 s, nothing created
  faults     Ctrl-C in the middle of a save, a rank killed in one, a disk that fills
             up: the previous checkpoint stays intact and no temporary is left behind
             (a later save removes what a killed one left)
  records    every record parses as strict JSON: a diverging run (null losses,
             diverged_at_step, a console line), paths with quotes, backslashes and
             non-ASCII, an --out longer than the old fixed buffers; a record, trace or
             timeline on a full disk ends the run non-zero naming the path
  kill_lab04, kill_lab05, kill_lab06
             a rank killed with SIGKILL in the middle of a step ends the whole job
             with a non-zero status within 10 s, and no rank is left behind
  io_error   a checkpoint that cannot be written at run time ends the job with one
             line naming the rank and the failing call

  launcher_signals
             SIGTERM and Ctrl-C to mpirun while rank 0 writes a save: the job
             ends, nothing is left behind, the last checkpoint resumes

usage: test_checkpoint.py resume|resume_lab06|format|refused|faults|records|kill_lab04|kill_lab05|kill_lab06|io_error|launcher_signals"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import MPIRUN, check, check_rejected, compare_runs, fail, on_cpu_unless_named, program, run  # noqa: E402

# the small model of the lab tests
MODEL = ["--layers", "4", "--d-model", "64", "--seq", "64", "--batch", "16"]

# (lab, ranks, lab flags): one layout per lab that really splits the state
LAYOUTS = [
    ("lab01_dp", 2, []),
    ("lab02_zero", 2, ["--zero-stage", "3"]),
    ("lab03_pp_naive", 2, []),
    ("lab04_1f1b", 2, ["--micro-batches", "4"]),
    ("lab05_tp", 2, []),
]
# lab06 at the grid of issue 7: every rank holds a TP shard of one stage's layers
LAB06 = ("lab06_3d", 4, ["--tp", "2", "--pp", "2", "--dp", "1"])


def read_checkpoint(path):
    """(header dict, data bytes) of a safetensors file, read the way any reader would."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def exact_resume(tmp, lab, n, flags, ref):
    """20 steps straight == 10, save, resume, 10, bit for bit, in losses, eval and the
    final state; --eval leaves the training figures alone; all within 1e-5 of lab01
    -n 1 (ref). Returns the checkpoint after 10 steps."""
    ck = f"{tmp}/{lab}.safetensors"
    straight, _, _ = run(lab, n, MODEL + flags + ["--steps", "20", "--eval", "--save", f"{tmp}/{lab}-20"])
    first, _, _ = run(lab, n, MODEL + flags + ["--steps", "10", "--save", ck, "--save-every", "5"])
    saved = f"{tmp}/{lab}-10"
    shutil.copy(ck, saved)
    second, _, _ = run(lab, n, MODEL + flags + ["--steps", "10", "--resume", ck, "--save", ck, "--eval"])
    check(first["losses"] == straight["losses"][:10], f"{lab}: the first 10 steps differ from the straight run")
    check(second["losses"] == straight["losses"][10:],
          f"{lab}: resumed losses {second['losses'][:3]}... != straight {straight['losses'][10:13]}...")
    check(second["first_step"] == 10 and second["resumed_from"] == ck, f"{lab}: the record must say where it resumed")
    check(second["eval_loss"] == straight["eval_loss"], f"{lab}: eval after resume differs")
    # the saved state too: the checkpoint after 10 + 10 steps is the one after 20
    _, d20 = read_checkpoint(f"{tmp}/{lab}-20")
    _, d2 = read_checkpoint(ck)
    check(d20 == d2, f"{lab}: the state after resume + 10 steps differs from 20 steps straight")
    # --eval must not change what the record says about training
    check(straight["comm_bytes_per_step"] == first["comm_bytes_per_step"],
          f"{lab}: --eval changed the traffic per step {straight['comm_bytes_per_step']} vs {first['comm_bytes_per_step']}")
    check(straight["mem_peak_bytes"] == first["mem_peak_bytes"], f"{lab}: --eval changed the memory peaks")
    compare_runs(f"{lab} -n {n} vs lab01 -n 1", straight, ref, 1e-5)
    check(abs(straight["eval_loss"] - ref["eval_loss"]) <= 1e-5 * ref["eval_loss"],
          f"{lab}: eval loss {straight['eval_loss']} vs lab01's {ref['eval_loss']}")
    print(f"{lab} -n {n}: resume bit-identical (losses and state); eval {straight['eval_loss']:.6f}", flush=True)
    return saved


def resume():
    tmp = tempfile.mkdtemp(prefix="pl-ckpt-")
    ref, _, _ = run("lab01_dp", 1, MODEL + ["--steps", "20", "--eval"])
    saved = {lab: exact_resume(tmp, lab, n, flags, ref) for lab, n, flags in LAYOUTS}
    check(ref["eval_loss"] < ref["losses"][0], "the held-out loss should have fallen from the initial loss")

    # across layouts: what one lab saved, another continues
    for source in ("lab04_1f1b", "lab05_tp", "lab02_zero"):
        for lab, n, flags in [("lab01_dp", 1, []), ("lab02_zero", 2, ["--zero-stage", "3"]),
                              ("lab04_1f1b", 4, ["--micro-batches", "2"]), ("lab05_tp", 4, [])]:
            if lab == source:
                continue
            rec, _, _ = run(lab, n, MODEL + flags + ["--steps", "10", "--resume", saved[source]])
            compare_runs(f"saved by {source}, resumed by {lab} -n {n}", rec, ref, 1e-5, ref_from=10)


def resume_lab06():
    tmp = tempfile.mkdtemp(prefix="pl-ckpt-")
    ref, _, _ = run("lab01_dp", 1, MODEL + ["--steps", "20", "--eval"])
    lab, n, flags = LAB06
    saved = exact_resume(tmp, lab, n, flags, ref)
    # shards and stages put back together: other labs, and lab06 at another grid
    # (two DP replicas load the same elements; under ZeRO-1 each its slice of the
    # moments), continue the serial curve
    for other, m, other_flags in [("lab01_dp", 1, []), ("lab02_zero", 2, ["--zero-stage", "3"]),
                                  ("lab06_3d", 4, ["--tp", "1", "--pp", "2", "--dp", "2"]),
                                  ("lab06_3d", 4, ["--tp", "1", "--pp", "2", "--dp", "2", "--zero-stage", "1"])]:
        rec, _, _ = run(other, m, MODEL + other_flags + ["--steps", "10", "--resume", saved])
        compare_runs(f"saved by {lab} -n {n} {' '.join(flags)}, resumed by {other} -n {m} {' '.join(other_flags)}", rec, ref, 1e-5, ref_from=10)
    # the grid may change, the model may not: a sound file for another shape is refused
    check_rejected(lab, n, flags + MODEL[:1] + ["2"] + MODEL[2:] + ["--resume", saved], "--layers")
    check_rejected(lab, n, flags + MODEL[:3] + ["128"] + MODEL[4:] + ["--resume", saved], "--d-model")


def expected_tensors(L, C, T, V=256):
    """model.h's layout with GPT-2 names: (name, shape) in file order."""
    layer = [("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [3 * C, C]),
             ("attn.c_attn.bias", [3 * C]), ("attn.c_proj.weight", [C, C]), ("attn.c_proj.bias", [C]),
             ("ln_2.weight", [C]), ("ln_2.bias", [C]), ("mlp.c_fc.weight", [4 * C, C]),
             ("mlp.c_fc.bias", [4 * C]), ("mlp.c_proj.weight", [C, 4 * C]), ("mlp.c_proj.bias", [C])]
    params = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    params += [(f"h.{l}.{name}", shape) for l in range(L) for name, shape in layer]
    params += [("ln_f.weight", [C]), ("ln_f.bias", [C]), ("lm_head.weight", [V, C])]
    return params + [("optimizer." + s + "." + name, shape) for s in "mv" for name, shape in params]


def fnv1a64(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def checksum_v2(meta, data):
    """Format 2: every metadata member but the checksum, by key, as key 0 value 0; then the data."""
    body = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in sorted(meta.items()) if k != "checksum")
    return f"fnv1a64:{fnv1a64(body + data):016x}"


def write_checkpoint(path, header, data):
    """A safetensors file of this header and data (padded as the labs pad)."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def format_():
    tmp = tempfile.mkdtemp(prefix="pl-ckpt-")
    L, C, T = 2, 32, 32
    small = ["--layers", str(L), "--d-model", str(C), "--seq", str(T), "--batch", "8", "--steps", "3"]
    run("lab01_dp", 1, small + ["--save", f"{tmp}/ck", "--dump-weights", f"{tmp}/w"])
    run("lab04_1f1b", 2, small + ["--micro-batches", "2", "--save", f"{tmp}/ck4"])
    for path in (f"{tmp}/ck", f"{tmp}/ck4"):
        header, data = read_checkpoint(path)
        meta = header.pop("__metadata__")
        check(all(isinstance(v, str) for v in meta.values()), "safetensors metadata values must be strings")
        for key, want in (("step", "3"), ("layers", str(L)), ("d_model", str(C)), ("seq", str(T)), ("vocab", "256"),
                          ("heads", "4"), ("seed", "1"), ("format", "parallel-labs-checkpoint-2")):
            check(meta.get(key) == want, f"{path}: metadata {key} = {meta.get(key)!r}, expected {want!r}")
        want = expected_tensors(L, C, T)
        check(list(header) == [name for name, _ in want], f"{path}: tensor names differ from the documented ones")
        offset = 0
        for name, shape in want:
            t = header[name]
            size = 4 * (shape[0] * (shape[1] if len(shape) > 1 else 1))
            check(t["dtype"] == "F32" and t["shape"] == shape and t["data_offsets"] == [offset, offset + size],
                  f"{path}: {name} is {t}, expected F32 {shape} at [{offset}, {offset + size}]")
            offset += size
        check(offset == len(data), f"{path}: {len(data)} data bytes, the tensors cover {offset}")
        check(meta["checksum"] == checksum_v2(meta, data),
              f"{path}: the checksum {meta['checksum']} is not format 2's FNV-1a of metadata and data")
        print(f"{path}: {len(want)} tensors, metadata {meta}")
    with open(f"{tmp}/w", "rb") as f:
        weights = f.read()
    _, data = read_checkpoint(f"{tmp}/ck")
    check(data[:len(weights)] == weights, "the checkpoint's parameters are not lab01's weights in layout order")
    _, data4 = read_checkpoint(f"{tmp}/ck4")
    check(len(data4) == len(data), "lab04's checkpoint has another size")
    print("parameters == lab01 --dump-weights; lab04 -n 2 writes the same tensors")

    # a file of format 1 (written before the checksum covered the header) still resumes, the same way
    header, data = read_checkpoint(f"{tmp}/ck")
    header["__metadata__"].update(format="parallel-labs-checkpoint-1", checksum=f"fnv1a64:{fnv1a64(data):016x}")
    write_checkpoint(f"{tmp}/ck-format1", header, data)
    resumed = [run("lab01_dp", 1, small[:-2] + ["--steps", "2", "--resume", f"{tmp}/{name}"])[0]
               for name in ("ck", "ck-format1")]
    check(resumed[0]["first_step"] == 3 and resumed[0]["losses"] == resumed[1]["losses"],
          f"a format 1 file must resume as its format 2 twin: {resumed[1]['losses']} vs {resumed[0]['losses']}")
    print(f"a format 1 checkpoint resumes like format 2: losses {resumed[1]['losses']}")


def refused():
    tmp = tempfile.mkdtemp(prefix="pl-ckpt-")
    good = f"{tmp}/good"
    run("lab01_dp", 1, MODEL + ["--steps", "1", "--save", good])
    with open(good, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])

    def write(name, data):
        with open(f"{tmp}/{name}", "wb") as f:
            f.write(data)
        return f"{tmp}/{name}"

    flipped = bytearray(blob)
    flipped[8 + n + 1000] ^= 0x10  # one bit of one weight
    reshaped = blob.replace(b'"shape":[192,64]', b'"shape":[193,64]', 1)
    restepped = blob.replace(b'"step":"1"', b'"step":"7"', 1)  # the header, not the data: format 2's checksum
    check(restepped != blob, "the header should hold \"step\":\"1\"")

    def sparse(name, head, size):
        """A file of `size` bytes starting with `head`, the rest a hole (no disk used)."""
        with open(f"{tmp}/{name}", "wb") as f:
            f.write(head)
            f.truncate(size)
        return f"{tmp}/{name}"
    bad_files = [
        (write("truncated", blob[:-100]), "truncated"),
        (write("header-only", blob[:8 + n]), "truncated"),
        (write("tiny", blob[:5]), "truncated"),
        (write("corrupted", bytes(flipped)), "checksum"),
        (write("reshaped", reshaped), "h.0.attn.c_attn.weight"),
        (write("not-json", struct.pack("<Q", 6) + b"{oops}" + blob[8 + n:]), "JSON"),
        (write("other-safetensors", struct.pack("<Q", 2) + b"{}"), "format"),
        (write("restepped", restepped), "checksum"),
        # large files that are no checkpoint: refused from their first bytes, not read whole
        (sparse("zeros-4GiB", b"", 4 << 30), "JSON"),
        (sparse("huge-header", struct.pack("<Q", 200 << 20), 300 << 20), "more than"),
        (f"{tmp}/missing", "No such file"),
        (tmp, "regular file"),
    ]
    for lab, n_ranks in (("lab04_1f1b", 2), ("lab05_tp", 2)):
        for path, needle in bad_files:
            check_rejected(lab, n_ranks, MODEL + ["--resume", path], f"--resume {path}: ")
            check_rejected(lab, n_ranks, MODEL + ["--resume", path], needle)
        # a sound file for another model shape: the message names the flag
        check_rejected(lab, n_ranks, MODEL[:1] + ["2"] + MODEL[2:] + ["--resume", good], "--layers")
        check_rejected(lab, n_ranks, MODEL[:3] + ["128"] + MODEL[4:] + ["--resume", good], "--d-model")
    check_rejected("lab01_dp", 2, MODEL + ["--save", f"{tmp}/no/such/folder/ck"], "--save")
    check_rejected("lab01_dp", 2, MODEL + ["--save", tmp], "--save")
    check_rejected("lab01_dp", 2, MODEL + ["--save-every", "5"], "--save-every")
    check_rejected("lab01_dp", 2, MODEL + ["--save-every", "-1", "--save", good], "--save-every")
    check_rejected("lab01_dp", 2, MODEL + ["--resume", ""], "--resume")
    print("every bad checkpoint refused by every rank before anything ran")


def temporaries(folder):
    return sorted(f for f in os.listdir(folder) if ".tmp." in f)


def mid_save(job, folder, timeout=20):
    """Wait until a save is under way: rank 0 writes its file (writing_in)."""
    t0 = time.time()
    rank0 = job.ranks()[0]
    while not writing_in(rank0, folder):
        check(job.p.poll() is None, "the job ended before it saved")
        check(time.time() - t0 < timeout, f"no save seen within {timeout} s")


def writing_in(pid, folder):
    """Whether process pid has a file of folder open for writing that is not the
    checkpoint itself: the save's unnamed file (O_TMPFILE, "#N (deleted)") or its
    named temporary."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder + "/") and ("(deleted)" in target or ".tmp." in target):
            return True
    return False


def launcher_signals():
    """SIGTERM and Ctrl-C (SIGINT) to mpirun while rank 0 writes a checkpoint, as a
    user sends them. Hydra forwards the signal to every rank and SIGKILLs the
    others a few milliseconds after the first one ends (strace of the proxy:
    kill(-rank, SIGTERM) for each, then kill(-rank, SIGKILL)), so a rank in a long
    write() or fsync() dies without running its handler: the save writes a file
    without a name, which dies with it. Each trial signals mpirun at a moment
    rank 0 is seen writing: the job ends within 10 s, no rank is left, no
    temporary is left, and the last complete checkpoint resumes."""
    big = ["--layers", "8", "--d-model", "128", "--seq", "64", "--batch", "16"]  # 20 MB: a save takes a while
    args = big + ["--steps", "100000", "--save-every", "1"]
    trials = 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        for trial in range(3):
            tmp = tempfile.mkdtemp(prefix="pl-launcher-")
            job = Job("lab01_dp", 2, args + ["--save", f"{tmp}/ck"])
            job.wait_for("checkpoint: 1 steps")
            mid_save(job, tmp)
            status = job.signal_and_wait(sig, 10)
            time.sleep(0.2)
            check(not job.ranks(), f"{sig.name}: ranks left running: {job.ranks()}")
            check(not temporaries(tmp), f"{sig.name} to mpirun mid-save left {temporaries(tmp)}")
            # the last complete save is whole: its header and every tensor's bytes (one resumes, below)
            header, data = read_checkpoint(f"{tmp}/ck")
            ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
            check(len(data) == max(ends), f"the checkpoint left by {sig.name} is cut: {len(data)} of {max(ends)} bytes")
            if trial == 0:
                rec, _, _ = run("lab01_dp", 1, big + ["--steps", "1", "--resume", f"{tmp}/ck"])
                check(rec["first_step"] >= 1, "the checkpoint resumes")
            print(f"{sig.name} to mpirun while rank 0 wrote: mpirun exit {status}, no temporary, the checkpoint of "
                  f"step {header['__metadata__'].get('step', '?')} is whole", flush=True)
            shutil.rmtree(tmp, ignore_errors=True)
            trials += 1
    print(f"{trials} signals to the launcher mid-save: nothing left behind")


def routing():
    """The experts in the file: their number is a shape (another --experts is refused in one line, a dense
    file too), the routing is not: a resume with another --top-k, --capacity-factor, --capacity-scope,
    --aux-loss-coef, --route-groups or --route-max-groups runs and says what changed in one line (before,
    it resumed silently)."""
    tmp = tempfile.mkdtemp(prefix="pl-routing-")
    small = ["--layers", "2", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "8", "--steps", "1"]
    run("lab01_dp", 1, small + ["--experts", "4", "--save", f"{tmp}/moe"])
    run("lab01_dp", 1, small + ["--save", f"{tmp}/dense"])
    meta = read_checkpoint(f"{tmp}/moe")[0]["__metadata__"]
    want = {"experts": "4", "top_k": "2", "capacity_factor": "0", "capacity_scope": "sequence", "aux_loss_coef": "0.01"}
    check(all(meta.get(k) == v for k, v in want.items()), f"the file records the experts: {meta}")
    _, p, _ = run("lab08_ep", 2, small + ["--resume", f"{tmp}/moe", "--top-k", "1", "--capacity-factor", "1.1",
                                          "--capacity-scope", "rank", "--aux-loss-coef", "0.3"])
    said = [line for line in p.stdout.splitlines() if "other routing" in line]
    check(len(said) == 1 and all(x in said[0] for x in ("--top-k 2 -> 1", "--capacity-factor 0 -> 1.1",
                                                        "--capacity-scope sequence -> rank", "--aux-loss-coef 0.01 -> 0.3")),
          f"one line saying what changed, got {said}")
    _, p, _ = run("lab08_ep", 2, small + ["--resume", f"{tmp}/moe"])
    check("other routing" not in p.stdout, "the same routing says nothing")
    # node-limited routing is routing too: a file without groups routed over every expert
    groups = ["--route-groups", "2", "--route-max-groups", "1"]
    _, p, _ = run("lab08_ep", 2, small + ["--resume", f"{tmp}/moe", "--save", f"{tmp}/groups"] + groups)
    check("--route-groups 0 -> 2, --route-max-groups 0 -> 1" in p.stdout, f"groups added, not said: {p.stdout[-400:]}")
    meta = read_checkpoint(f"{tmp}/groups")[0]["__metadata__"]
    check((meta.get("route_groups"), meta.get("route_max_groups")) == ("2", "1"), f"the file records the groups: {meta}")
    _, p, _ = run("lab01_dp", 1, small + ["--resume", f"{tmp}/groups", "--experts", "4"])
    check("--route-groups 2 -> 0, --route-max-groups 1 -> 0" in p.stdout, f"groups dropped, not said: {p.stdout[-400:]}")
    check_rejected("lab08_ep", 2, small + ["--resume", f"{tmp}/moe", "--experts", "8"], "--experts 4")
    check_rejected("lab01_dp", 2, small + ["--resume", f"{tmp}/dense", "--experts", "4"], "--experts 0")
    check_rejected("lab01_dp", 2, small + ["--resume", f"{tmp}/moe"], "--experts 4")
    print(f"the experts in the file {want}; another routing said in one line: {said[0]}")
    shutil.rmtree(tmp, ignore_errors=True)


def interrupted():
    """SIGTERM or Ctrl-C (SIGINT) between saves: every rank finishes the step it is in, they agree
    (run_step_end), the run saves that step with --save, writes its record with "interrupted" and
    steps_done, and each rank's own status is 128 + the signal. mpirun's status is not asserted:
    hydra reported 0 for such jobs in most tries here (docs/cluster.md: check the record)."""
    # one rank without mpirun (MPICH's singleton): the lab's own status is what the shell sees
    tmp = tempfile.mkdtemp(prefix="pl-interrupt-")
    cmd = [program("lab01_dp"), *on_cpu_unless_named(MODEL + ["--steps", "100000", "--save", f"{tmp}/ck"]),
           "--out", f"{tmp}/runs"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)
    reader.start()
    t0 = time.time()
    while not any(line.startswith("step 3/") for line in lines):
        check(p.poll() is None and time.time() - t0 < 60, "lab01 -n 1 did not reach step 3")
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    status = p.wait(timeout=20)
    reader.join(5)
    check(status == 128 + signal.SIGTERM, f"lab01 -n 1 after SIGTERM: status {status}, want 143\n{''.join(lines)}")
    with open(f"{tmp}/runs/records.jsonl") as f:
        rec = json.loads(f.readlines()[-1])
    done = rec["steps_done"]
    check(rec["interrupted"] == "SIGTERM" and 3 <= done == len(rec["losses"]) < rec["config"]["steps"],
          f"the record: interrupted {rec['interrupted']}, steps_done {done} of {rec['config']['steps']}")
    header, _ = read_checkpoint(f"{tmp}/ck")
    check(int(header["__metadata__"]["step"]) == done, f"saved step {header['__metadata__']['step']}, the run did {done}")
    resumed, _, _ = run("lab01_dp", 2, MODEL + ["--steps", "2", "--resume", f"{tmp}/ck"])
    check(resumed["first_step"] == done and resumed["interrupted"] is None and resumed["steps_done"] == 2,
          f"resumed at {resumed['first_step']}, want {done}; a finished run records no interruption")
    print(f"SIGTERM to lab01 -n 1: status {status}, record interrupted after {done} steps, saved there, resumes")
    shutil.rmtree(tmp, ignore_errors=True)
    # a pipeline under mpirun: its stages stop after the same step
    for sig in (signal.SIGINT, signal.SIGTERM):
        job = Job("lab04_1f1b", 2, MODEL + ["--steps", "100000", "--micro-batches", "4"])
        job.wait_for("step 3/")
        status = job.signal_and_wait(sig, 20)
        with open(os.path.join(job.out, "records.jsonl")) as f:
            rec = json.loads(f.readlines()[-1])
        check(rec["interrupted"] == sig.name and rec["steps_done"] == len(rec["losses"]) >= 3,
              f"lab04 -n 2 after {sig.name}: the record says interrupted {rec['interrupted']}, "
              f"{rec['steps_done']} steps")
        print(f"{sig.name} to mpirun -n 2 lab04: the record says interrupted after {rec['steps_done']} steps "
              f"(mpirun's status {status})")


def dead_pid():
    """The pid of a process that has exited (a killed save's temporary carries one)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


SMALL = ["--layers", "2", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "8"]


def faults():
    # Ctrl-C (mpirun forwards SIGINT to the ranks) in the middle of a save: the save's
    # file has no name until it is whole, and dies with the rank; the last complete
    # checkpoint stays (launcher_signals tries SIGTERM and SIGINT several times)
    tmp = tempfile.mkdtemp(prefix="pl-fault-")
    args = MODEL + ["--steps", "100000", "--save", f"{tmp}/ck", "--save-every", "1"]
    job = Job("lab01_dp", 2, args)
    job.wait_for("checkpoint: 1 steps")
    mid_save(job, tmp)
    job.p.send_signal(signal.SIGINT)
    status = job.p.wait(timeout=10)  # (mpirun's own status after one Ctrl-C is 2 or, at times, 0)
    job.join()
    check(not temporaries(tmp), f"Ctrl-C during a save left {temporaries(tmp)}")
    rec, _, _ = run("lab01_dp", 1, MODEL + ["--steps", "1", "--resume", f"{tmp}/ck"])
    print(f"Ctrl-C mid-save: exit {status}, no temporary, the checkpoint of step {rec['first_step']} resumes")

    # SIGKILL cannot be caught: a temporary it leaves (a named one, where the file
    # system has no O_TMPFILE or the kill lands between naming and rename) is removed
    # by the next save, as is one planted with the pid of a process that is gone, so
    # the check never depends on when the kill landed
    job = Job("lab01_dp", 2, args)
    job.wait_for("checkpoint: 1 steps")
    rank0 = job.ranks()[0]
    mid_save(job, tmp)
    os.kill(rank0, signal.SIGKILL)
    job.p.wait(timeout=10)
    job.join()
    left = temporaries(tmp)
    planted = f"{tmp}/ck.tmp.{dead_pid()}"
    with open(planted, "w") as f:
        f.write("half a checkpoint")
    check(os.path.exists(planted), "could not plant a stale temporary")
    rec, p, _ = run("lab01_dp", 1, MODEL + ["--steps", "1", "--resume", f"{tmp}/ck", "--save", f"{tmp}/ck"])
    check(not temporaries(tmp), f"a save must remove the stale temporaries of its target: {temporaries(tmp)}")
    check(p.stdout.count("left by a write that did not finish") == len(left) + 1,
          f"the save should say what it removed ({left} and {planted}): {p.stdout}")
    print(f"rank 0 killed mid-save left {left}; the next save removed it and {os.path.basename(planted)}")

    # a full disk: a tmpfs with room for one checkpoint, not for the next one's temporary
    disk = tempfile.mkdtemp(prefix="pl-full-")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=768k", "tmpfs", disk], capture_output=True).returncode:
        print("skipped the full-disk save: cannot mount a tmpfs here (needs root)")
        return
    try:
        job = Job("lab01_dp", 1, SMALL + ["--steps", "3", "--save", f"{disk}/ck", "--save-every", "1"])
        status = job.p.wait(timeout=60)
        job.join()
        errors = [line.strip() for line in job.errors if "error" in line]
        small_size = os.path.getsize(f"{disk}/ck")
        check(2 * small_size > 768 << 10 > small_size, f"a checkpoint of {small_size} bytes does not fit the test")
        check(status != 0, "a save on a full disk must fail the run")
        check(any(line.startswith("rank 0: error: ") and "No space left on device" in line and disk in line
                  for line in errors), f"expected one line naming the file and the full disk, got {errors}")
        check(not temporaries(disk), f"a failed save left {temporaries(disk)}")
        header, _ = read_checkpoint(f"{disk}/ck")
        check(header["__metadata__"]["step"] == "1", "the previous checkpoint (step 1) must stay")
        run("lab01_dp", 1, SMALL + ["--steps", "1", "--resume", f"{disk}/ck"])
        print(f"full disk at the second save: exit {status}, {errors[0]!r}; step 1's checkpoint intact, "
              f"no temporary")
    finally:
        subprocess.run(["umount", disk])


def records():
    tmp = tempfile.mkdtemp(prefix="pl-rec-")
    # a diverging run: the record says where, with null for the losses that are not finite
    rec, p, _ = run("lab01_dp", 1, SMALL + ["--steps", "4", "--lr", "1e30", "--eval"])
    at = rec["diverged_at_step"]
    check(at is not None and rec["losses"][at - 1] is None and all(x is not None for x in rec["losses"][:at - 1]),
          f"diverged_at_step {at} must be the first null loss: {rec['losses']}")
    check(f"step {at}: the loss is" in p.stdout and "diverged" in p.stdout, "the console must say the run diverged")
    check(rec["eval_loss"] is None, f"a diverged eval loss is null, got {rec['eval_loss']}")
    healthy, _, _ = run("lab01_dp", 1, SMALL + ["--steps", "2"])
    check(healthy["diverged_at_step"] is None, "a finite run records diverged_at_step null")
    print(f"diverging run: losses {rec['losses']}, diverged_at_step {at}")

    # names JSON must escape, and bytes that are not UTF-8, in --out, --data and --save
    odd = os.path.join(tmp, 'quote"back\\slash \u00e9t\u00e9')
    os.mkdir(odd)
    data = os.path.join(odd, "corpus.txt")
    with open(data, "w") as f:
        f.write("the cat sees the dog. " * 200)
    not_utf8 = os.fsdecode(os.path.join(tmp, "latin1-\xe9").encode("latin-1"))
    rec, _, out = run("lab01_dp", 1, SMALL + ["--steps", "1", "--data", data, "--save", f"{odd}/ck",
                                              "--dump-weights", not_utf8])
    check(rec["config"]["data"] == data and rec["saved_to"] == f"{odd}/ck",
          f"paths must come back exactly: {rec['config']['data']!r}, {rec['saved_to']!r}")
    header, _ = read_checkpoint(f"{odd}/ck")
    check(header["__metadata__"]["data"] == data, "the checkpoint's metadata must hold the --data path")
    rec, _, _ = run("lab01_dp", 1, SMALL + ["--steps", "1", "--data", data, "--resume", f"{odd}/ck",
                                            "--save", not_utf8])
    check(rec["saved_to"].endswith("latin1-?"), f"bytes that are not UTF-8 become '?': {rec['saved_to']!r}")

    # an --out longer than the 512-byte buffers the paths once had
    deep = os.path.join(tmp, *(["d" * 100] * 6))
    rec, _, _ = run("lab01_dp", 1, SMALL + ["--steps", "1"], out=deep)
    check(rec is not None and rec["trace"].startswith(deep) and os.path.exists(rec["trace"]),
          f"no record, or its trace not in the {len(deep)}-character --out")
    print(f"odd names round-trip through the record; a {len(deep)}-character --out holds record and trace")

    # a full disk where the record, the trace or the timeline go: exit non-zero, naming the path
    for name in ("records.jsonl", "records.csv", "lab01_dp_dp_1_trace.json", "lab01_dp_dp_1_timeline.csv"):
        out = tempfile.mkdtemp(prefix="pl-full-")
        os.symlink("/dev/full", os.path.join(out, name))
        cmd = [MPIRUN, "-n", "1", program("lab01_dp"), *SMALL, "--steps", "1", "--out", out]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        errors = [line for line in p.stderr.splitlines() if "error" in line]
        print(f"{name} on a full disk: exit {p.returncode}, {errors[:1]}")
        check(p.returncode != 0, f"{name}: a record lost to a full disk must fail the run")
        check(any(os.path.join(out, name) in line and "No space left on device" in line for line in errors),
              f"{name}: expected a line naming the file and the reason, got {errors}")


class Job:
    """mpirun in the background, its output collected line by line."""

    def __init__(self, lab, n, args):
        self.out = tempfile.mkdtemp(prefix="pl-kill-")
        self.prog = program(lab)
        cmd = [MPIRUN, "-n", str(n), self.prog, *on_cpu_unless_named(args), "--out", self.out]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        self.lines, self.errors = [], []  # stdout and stderr, apart: mpirun interleaves their chunks
        self.readers = [threading.Thread(target=lambda f=f, to=to: to.extend(iter(f.readline, "")), daemon=True)
                        for f, to in ((self.p.stdout, self.lines), (self.p.stderr, self.errors))]
        for r in self.readers:
            r.start()

    def join(self):
        for r in self.readers:
            r.join(5)

    def signal_and_wait(self, sig, seconds):
        """Send mpirun sig; its status once the job ended, within `seconds` (or the test fails)."""
        self.p.send_signal(sig)
        try:
            status = self.p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.p.kill()
            fail(f"mpirun still running {seconds} s after {sig.name}")
        self.join()
        return status

    def wait_for(self, text, timeout=60):
        t0 = time.time()
        while not any(text in line for line in self.lines):
            check(self.p.poll() is None, f"the job ended before printing {text!r}:\n{''.join(self.lines)}")
            check(time.time() - t0 < timeout, f"no {text!r} within {timeout} s")
            time.sleep(0.02)

    def ranks(self):
        """{rank: pid} of this job's processes (hydra gives each its PMI_RANK)."""
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
                if argv[0] != self.prog or self.out not in argv:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(e.split("=", 1) for e in f.read().decode(errors="replace").split("\0") if "=" in e)
                found[int(env["PMI_RANK"])] = int(pid)
            except (OSError, KeyError, ValueError):
                pass  # not ours, or gone meanwhile
        return found


def kill(lab, n, victim, flags):
    job = Job(lab, n, MODEL + flags + ["--steps", "100000"])
    job.wait_for("step 3/")
    ranks = job.ranks()
    check(sorted(ranks) == list(range(n)), f"expected ranks 0..{n - 1} of this job, found {ranks}")
    t0 = time.time()
    os.kill(ranks[victim], signal.SIGKILL)
    try:
        status = job.p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        job.p.kill()
        fail_msg = f"{lab} -n {n}: mpirun still running 10 s after rank {victim} was killed (a hang)"
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        check(False, fail_msg)
    dt = time.time() - t0
    job.join()
    time.sleep(0.2)
    left = job.ranks()
    print(f"{lab} -n {n}: rank {victim} (pid {ranks[victim]}) killed after step 3 -> mpirun exit {status} "
          f"in {dt:.2f} s; ranks left: {left}")
    check(status != 0, f"{lab}: mpirun exited 0 although rank {victim} was killed")
    check(dt < 10, f"{lab}: the job took {dt:.1f} s to end")
    check(not left, f"{lab}: ranks still running after mpirun exited: {left}")


def io_error():
    folder = tempfile.mkdtemp(prefix="pl-io-")
    job = Job("lab04_1f1b", 2, MODEL + ["--steps", "100000", "--save", f"{folder}/ck", "--save-every", "40"])
    job.wait_for("step 1/")
    os.rmdir(folder)  # the folder was fine at start-up; the first save cannot write there
    t0 = time.time()
    try:
        status = job.p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        job.p.kill()
        check(False, "the job did not end after its checkpoint failed")
    job.join()
    errors = [line.strip() for line in job.errors if "error" in line]
    print(f"exit {status} {time.time() - t0:.1f} s after the folder vanished; {errors[:1]}")
    check(status != 0, "a failed save must fail the job")
    check(any(line.startswith("rank 0: error: open(") and folder in line for line in errors),
          f"expected 'rank 0: error: open(<file in {folder}>...', got {errors}")


if __name__ == "__main__":
    {"resume": resume, "format": format_, "refused": refused, "io_error": io_error, "faults": faults,
     "launcher_signals": launcher_signals, "interrupted": interrupted, "routing": routing,
     "records": records,
     "kill_lab04": lambda: kill("lab04_1f1b", 3, 1, ["--micro-batches", "4"]),  # the middle stage
     "kill_lab05": lambda: kill("lab05_tp", 2, 1, []),
     # rank 1: (tp 1, pp 0), so its TP peer waits in an all-reduce, stage 1 on a message
     "kill_lab06": lambda: kill(LAB06[0], LAB06[1], 1, LAB06[2]),
     "resume_lab06": resume_lab06}[sys.argv[1]]()
    print("passed")
