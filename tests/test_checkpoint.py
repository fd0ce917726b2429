"""Checkpoints and failures, across the labs.

  resume     every lab: 20 steps straight == 10 steps, save, resume, 10 steps, bit
             for bit (losses and the final checkpoint); a checkpoint saved at one
             layout resumes at others within 1e-5 of lab01 -n 1; --eval is the same
             whatever the layout and leaves the training figures alone
  resume_lab06
             the same for lab06 at t x p x d = 2 x 2 x 1, its checkpoint continued
             by lab01 -n 1, lab02 --zero-stage 3 -n 2 and lab06 at 1 x 2 x 2; a
             lab06 checkpoint with other --layers / --d-model flags is refused
  format     the file is plain safetensors: the header parses with json, the tensor
             names, shapes and offsets are the documented ones, the checksum is the
             FNV-1a of the data, and the parameters are lab01's --dump-weights
  refused    truncated, corrupted, mismatched and non-checkpoint files: status 2 on
             every rank, one line naming the file, within 5 s, nothing created
  kill_lab04, kill_lab05, kill_lab06
             a rank killed with SIGKILL in the middle of a step ends the whole job
             with a non-zero status within 10 s, and no rank is left behind
  io_error   a checkpoint that cannot be written at run time ends the job with one
             line naming the rank and the failing call

usage: test_checkpoint.py resume|resume_lab06|format|refused|kill_lab04|kill_lab05|kill_lab06|io_error"""
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
from labtest import MPIRUN, check, check_rejected, compare_losses, on_cpu_unless_named, program, run  # noqa: E402

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
    compare_losses(f"{lab} -n {n} vs lab01 -n 1", straight["losses"], ref["losses"], 1e-5)
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
            compare_losses(f"saved by {source}, resumed by {lab} -n {n}", rec["losses"], ref["losses"][10:], 1e-5)


def resume_lab06():
    tmp = tempfile.mkdtemp(prefix="pl-ckpt-")
    ref, _, _ = run("lab01_dp", 1, MODEL + ["--steps", "20", "--eval"])
    lab, n, flags = LAB06
    saved = exact_resume(tmp, lab, n, flags, ref)
    # shards and stages put back together: other labs, and lab06 at another grid
    # (two DP replicas load the same elements), continue the serial curve
    for other, m, other_flags in [("lab01_dp", 1, []), ("lab02_zero", 2, ["--zero-stage", "3"]),
                                  ("lab06_3d", 4, ["--tp", "1", "--pp", "2", "--dp", "2"])]:
        rec, _, _ = run(other, m, MODEL + other_flags + ["--steps", "10", "--resume", saved])
        compare_losses(f"saved by {lab} -n {n} {' '.join(flags)}, resumed by {other} -n {m} {' '.join(other_flags)}",
                       rec["losses"], ref["losses"][10:], 1e-5)
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
                          ("heads", "4"), ("seed", "1"), ("format", "parallel-labs-checkpoint-1")):
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
        check(meta["checksum"] == f"fnv1a64:{fnv1a64(data):016x}", f"{path}: the checksum is not the data's FNV-1a")
        print(f"{path}: {len(want)} tensors, metadata {meta}")
    with open(f"{tmp}/w", "rb") as f:
        weights = f.read()
    _, data = read_checkpoint(f"{tmp}/ck")
    check(data[:len(weights)] == weights, "the checkpoint's parameters are not lab01's weights in layout order")
    _, data4 = read_checkpoint(f"{tmp}/ck4")
    check(len(data4) == len(data), "lab04's checkpoint has another size")
    print("parameters == lab01 --dump-weights; lab04 -n 2 writes the same tensors")


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
    bad_files = [
        (write("truncated", blob[:-100]), "truncated"),
        (write("header-only", blob[:8 + n]), "truncated"),
        (write("tiny", blob[:5]), "truncated"),
        (write("corrupted", bytes(flipped)), "checksum"),
        (write("reshaped", reshaped), "h.0.attn.c_attn.weight"),
        (write("not-json", struct.pack("<Q", 6) + b"{oops}" + blob[8 + n:]), "JSON"),
        (write("other-safetensors", struct.pack("<Q", 2) + b"{}"), "format"),
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
    check(any(line.startswith("rank 0: error: fopen(") and folder in line for line in errors),
          f"expected 'rank 0: error: fopen(<file in {folder}>...', got {errors}")


if __name__ == "__main__":
    {"resume": resume, "format": format_, "refused": refused, "io_error": io_error,
     "kill_lab04": lambda: kill("lab04_1f1b", 3, 1, ["--micro-batches", "4"]),  # the middle stage
     "kill_lab05": lambda: kill("lab05_tp", 2, 1, []),
     # rank 1: (tp 1, pp 0), so its TP peer waits in an all-reduce, stage 1 on a message
     "kill_lab06": lambda: kill(LAB06[0], LAB06[1], 1, LAB06[2]),
     "resume_lab06": resume_lab06}[sys.argv[1]]()
    print("passed")
