"""Bad input, every lab: the shared cases and each lab's own, table-driven.

For each case every rank must exit with status 2 within 5 s, rank 0 (or the
rank that found the problem) prints exactly one line `error: ...` naming the
flag or file, nothing else is printed, and the --out folder is not created.

usage: test_bad_input.py LAB      (e.g. lab04_1f1b)
       test_bad_input.py tags_boundary   (lab04 at the last layout MPI's tags allow: runs)"""
import concurrent.futures
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labtest import check, check_rejected, has_gpu, program, run, startup_seconds  # noqa: E402

EMPTY = tempfile.NamedTemporaryFile(delete=False, prefix="pl-empty-").name
A_FOLDER = tempfile.mkdtemp(prefix="pl-folder-")  # exists, but is no text file
SPECIAL = tempfile.mkdtemp(prefix="pl-special-")
FIFO = os.path.join(SPECIAL, "fifo")  # opening it for reading would wait for a writer forever
os.mkfifo(FIFO)
HUGE = os.path.join(SPECIAL, "huge")  # sparse: over --data's 1 GiB limit without using the disk
with open(HUGE, "wb") as f:
    f.truncate((1 << 30) + 1)
# a --save whose temporary name (PATH.tmp.PID) cannot exist: the name is at NAME_MAX already
LONG_NAME = os.path.join(SPECIAL, "c" * 255)

# (ranks, args, what the one-line message must contain)
SHARED = [
    (2, ["--bogus"], "--bogus"),
    (2, ["--steps"], "--steps"),
    (2, ["--steps", "abc"], "--steps"),
    (2, ["--steps", "2.5"], "--steps"),
    (2, ["--steps", "0"], "--steps"),
    (2, ["--batch", "-4"], "--batch"),
    (2, ["--layers", "0"], "--layers"),
    (2, ["--d-model", "0"], "--d-model"),
    (2, ["--seq", "0"], "--seq"),
    (2, ["--heads", "0"], "--heads"),
    (2, ["--heads", "5"], "--heads"),
    (2, ["--lr", "-1"], "--lr"),
    (2, ["--lr", "fast"], "--lr"),
    (2, ["--seed", "-1"], "--seed"),
    (2, ["--weight-decay", "-0.1"], "--weight-decay"),
    (2, ["--data", "/nonexistent/corpus.txt"], "--data"),
    (2, ["--data", EMPTY], "--data"),
    (2, ["--data", A_FOLDER], "--data"),
    (2, ["--device", "gpu"], "--device"),
    (2, ["--comm", "nccl", "--device", "cpu"], "--comm"),
    (2, ["--out", "/proc/parallel-labs-test"], "--out"),
    (2, ["stray"], "stray"),
    # float flags are used as floats: finite as a double is not enough
    (2, ["--lr", "1e39"], "--lr"),
    (2, ["--clip", "1e39"], "--clip"),
    # the flight recorder and its watchdog (common/flight.h)
    (2, ["--hang-timeout", "-1"], "--hang-timeout"),
    (2, ["--hang-timeout", "soon"], "--hang-timeout"),
    (2, ["--flight-records", "-1"], "--flight-records"),
    (2, ["--flight-records", "2000000"], "--flight-records"),
    (2, ["--check-collectives=1"], "--check-collectives"),
    (2, ["--weight-decay", "1e-50"], "--weight-decay"),
    # inputs that are not regular files, or too large, are refused before they are read
    (2, ["--data", FIFO], "--data"),
    (2, ["--data", "/dev/zero"], "--data"),
    (2, ["--data", HUGE], "limit"),
    (2, ["--resume", FIFO], "--resume"),
    (2, ["--resume", "/dev/zero"], "--resume"),
    # outputs proven writable at start-up, by creating a file where they go
    (2, ["--out", EMPTY], "--out"),  # a file, not a folder
    (2, ["--out", EMPTY + "/runs"], "--out"),  # under a file
    (2, ["--out", "/" + "x" * 5000], "--out"),  # longer than PATH_MAX
    (2, ["--save", EMPTY + "/ck"], "--save"),
    (2, ["--save", "/proc/ck.safetensors"], "--save"),  # a folder nobody (root included) can write in
    (2, ["--save", "/dev/null"], "--save"),  # not a regular file: never replaced
    (2, ["--save", FIFO], "--save"),
    (2, ["--save", LONG_NAME], "--save"),
    (2, ["--save", ""], "--save needs a file name"),
    (2, ["--out", ""], "--out needs a folder name"),
    (2, ["--preset", "huge"], "--preset"),
    (2, ["--preset"], "--preset"),
    (2, ["--preset", "gpt2-small", "--heads", "5"], "--heads"),  # 5 does not divide 768
    (2, ["--recompute", "partial"], "--recompute"),  # an unknown mode
    (2, ["--recompute"], "--recompute"),
    (2, ["--precision", "fp16"], "--precision"),
    (2, ["--precision"], "--precision"),
    (2, ["--sample", "-1"], "--sample"),
    (2, ["--sample", "100001"], "--sample"),
    (2, ["--prompt", ""], "--prompt"),
    (2, ["--temperature", "-0.5"], "--temperature"),
    # --dry-run checks what the run would: the same errors, the same status
    (2, ["--dry-run=yes"], "--dry-run"),
    (2, ["--dry-run", "--steps", "0"], "--steps"),
    (2, ["--dry-run", "--data", "/nonexistent/corpus.txt"], "--data"),
    (2, ["--dry-run", "--out", EMPTY], "--out"),
    (2, ["--dry-run", "--save", "/proc/ck.safetensors"], "--save"),
    # mixture of experts
    (2, ["--experts", "-1"], "--experts"),
    (2, ["--experts", "4", "--top-k", "0"], "--top-k"),
    (2, ["--experts", "2", "--top-k", "3"], "--top-k"),  # k > E
    (2, ["--experts", "4", "--capacity-factor", "-1"], "--capacity-factor"),
    (2, ["--experts", "4", "--aux-loss-coef", "-0.5"], "--aux-loss-coef"),
    (2, ["--experts", "4", "--expert-width", "-8"], "--expert-width"),
    (2, ["--experts", "4", "--shared-experts", "-1"], "--shared-experts"),
    (2, ["--dry-run", "--experts", "4"], "--experts"),  # kept for the labs that refuse experts (DRY_RUN_EXPERTS)
    (2, ["--capacity-scope", "token"], "--capacity-scope"),
    (2, ["--experts", "4", "--router", "relu"], "--router"),
    (2, ["--experts", "4", "--balance", "none"], "--balance"),
    (2, ["--experts", "4", "--balance", "bias", "--bias-speed", "-1"], "--bias-speed"),
    (2, ["--experts", "4", "--balance", "bias", "--bias-speed", "0"], "--bias-speed"),
    (2, ["--experts", "4", "--balance", "bias", "--aux-loss-coef", "0.1"], "--aux-loss-coef"),  # bias: no aux loss
    (2, ["--experts", "4", "--bias-speed", "0.01"], "--bias-speed"),  # the aux loss balances: no bias to move
    (2, ["--experts", "4", "--route-groups", "3"], "--route-groups"),  # 3 groups of 4 experts
    (2, ["--experts", "4", "--route-groups", "2", "--route-max-groups", "3"], "--route-max-groups"),  # M > G
    (2, ["--experts", "4", "--top-k", "3", "--route-groups", "4", "--route-max-groups", "2"], "--top-k"),  # k > M E/G
    (2, ["--experts", "4", "--route-max-groups", "1"], "--route-max-groups"),  # no groups to limit
    # dependent flags (docs/flags.md): given while the flag they act through is off, refused in one line
    (2, ["--save-every", "2"], "--save-every"),
    (2, ["--prompt", "the dog"], "--prompt"),
    (2, ["--temperature", "0.5"], "--temperature"),
    (2, ["--sample", "0", "--temperature", "0.5"], "--temperature"),
    (2, ["--experts", "4", "--capacity-scope", "rank"], "--capacity-scope"),  # F = 0: nothing to scope
    (2, ["--capacity-scope", "sequence"], "--capacity-scope"),
]
# the experts' flags in a dense model (every lab but lab08, whose default has experts; lab05-lab07 take no
# experts at all, so these were accepted there and trained a dense model)
DENSE_DEPENDENT = [
    (2, ["--top-k", "1"], "--top-k"),
    (2, ["--capacity-factor", "1"], "--capacity-factor"),
    (2, ["--aux-loss-coef", "0.1"], "--aux-loss-coef"),
    (2, ["--experts", "0", "--top-k", "1"], "--top-k"),
    (2, ["--router", "sigmoid"], "--router"),
    (2, ["--balance", "bias"], "--balance"),
    (2, ["--bias-speed", "0.01"], "--bias-speed"),
    (2, ["--route-groups", "2"], "--route-groups"),
    (2, ["--expert-width", "16"], "--expert-width"),
    (2, ["--shared-experts", "1"], "--shared-experts"),
]
# the labs whose --dry-run takes --experts (its prediction counts them)
DRY_RUN_EXPERTS = ("lab01_dp", "lab02_zero", "lab03_pp_naive", "lab04_1f1b", "lab08_ep", "lab09_5d")
# one MPI tag per message of a step, 2 p v m of them: 2 ranks x 4 chunks x 2048 micro-batches is 32768,
# beyond the 32767 tags MPI guarantees; 2046 micro-batches (32736 messages) run (tags_boundary)
TAGS_OVER = ["--schedule", "interleaved", "--virtual-stages", "4", "--micro-batches", "2048", "--batch", "2048"]

# sequence parallelism splits what tensor parallelism leaves whole: a lab without TP has no such flag
NO_TP = [(2, ["--sequence-parallel"], "--sequence-parallel")]
# labs whose layers do not run experts (lab05, lab06: TP without the experts' slot)
NO_EXPERTS = [(2, ["--experts", "4"], "--experts")]

PER_LAB = {
    "lab01_dp": [
        # a micro-batch's rows are not the rank's: the capacity per rank would change with K
        (2, ["--experts", "4", "--capacity-factor", "1", "--capacity-scope", "rank", "--grad-accum", "2"],
         "--capacity-scope rank"),
        (4, ["--batch", "30"], "--batch"),  # the ranks must share the batch evenly
        (2, ["--bucket-mb", "-1"], "--bucket-mb"),
        (2, ["--check-sync=yes"], "--check-sync"),
        (2, ["--bucket-mb", "1e39"], "--bucket-mb"),
        (2, ["--dump-weights", "/proc/weights"], "--dump-weights"),
        (2, ["--dump-weights", EMPTY + "/weights"], "--dump-weights"),
        (2, ["--dump-weights", "/dev/null"], "--dump-weights"),
        (2, ["--dump-weights", ""], "--dump-weights needs a file name"),  # was refused only after training
        (2, ["--dry-run", "--dump-weights", ""], "--dump-weights needs a file name"),
        (4, ["--dry-run", "--batch", "30"], "--batch"),
        (2, ["--grad-accum", "3"], "--grad-accum"),  # 16 rows per rank: K must divide them
        (2, ["--grad-accum", "0"], "--grad-accum"),
        (2, ["--dry-run", "--grad-accum", "3"], "--grad-accum"),  # --dry-run takes K (th_run.grad_accum), not this one
    ] + NO_TP,
    "lab02_zero": [
        (2, ["--zero-stage", "0"], "--zero-stage"),
        (2, ["--zero-stage", "4"], "--zero-stage"),
        (2, ["--zero-stage", "x"], "--zero-stage"),
        (2, ["--zero-stage"], "--zero-stage"),
        (2, ["--zero-stage", "3", "--bucket-mb", "1"], "--bucket-mb"),
        (3, ["--batch", "32", "--zero-stage", "2"], "--batch"),
        (2, ["--dry-run", "--zero-stage", "3", "--bucket-mb", "1"], "--bucket-mb"),
    ] + NO_TP,
    "lab03_pp_naive": [
        (4, ["--layers", "3"], "--layers"),  # more stages than layers
        (2, ["--layers", "1"], "--layers"),  # every stage needs a layer
        (2, ["--micro-batches", "4"], "--micro-batches"),  # lab04's flag, not this lab's
        (4, ["--dry-run", "--layers", "3"], "--layers"),
    ] + NO_TP,
    "lab04_1f1b": [
        # as lab01's --grad-accum: the capacity would count a micro-batch's rows, not the rank's
        (2, ["--experts", "4", "--capacity-factor", "1", "--capacity-scope", "rank"], "--micro-batches 8"),
        (2, ["--experts", "4", "--capacity-factor", "1", "--capacity-scope", "rank", "--micro-batches", "2"],
         "--capacity-scope rank"),
        (4, ["--layers", "3"], "--layers"),
        (2, ["--micro-batches", "0"], "--micro-batches"),
        (2, ["--micro-batches", "-3"], "--micro-batches"),
        (2, ["--micro-batches", "two"], "--micro-batches"),
        (2, ["--batch", "30", "--micro-batches", "4"], "--micro-batches"),
        (4, ["--batch", "8", "--micro-batches", "16"], "--micro-batches"),
        (2, ["--schedule", "zb-h2"], "--schedule"),  # an unknown schedule
        (2, ["--schedule", "1F1B"], "--schedule"),
        (2, ["--schedule"], "--schedule"),
        (2, ["--virtual-stages", "0"], "--virtual-stages"),  # v < 1
        # v with a schedule that takes none (or, zb-v, only 2)
        (2, ["--schedule", "1f1b", "--virtual-stages", "2"], "--virtual-stages"),
        (2, ["--schedule", "zb-v", "--virtual-stages", "3"], "--virtual-stages"),
        (2, ["--schedule", "interleaved", "--virtual-stages", "1"], "--virtual-stages"),
        # layers not divisible by ranks x chunks
        (2, ["--schedule", "interleaved", "--virtual-stages", "3"], "--layers"),
        (2, ["--schedule", "zb-v", "--layers", "6"], "--layers"),
        # m too small (or not a multiple of p) for the schedule
        (4, ["--schedule", "interleaved", "--micro-batches", "6", "--batch", "24"], "--micro-batches"),
        (4, ["--schedule", "zb-h1", "--micro-batches", "2"], "--micro-batches"),
        (2, ["--schedule", "zb-v", "--micro-batches", "2"], "--micro-batches"),
        (2, ["--print-schedule", "--schedule", "zb-v", "--micro-batches", "2"], "--micro-batches"),
        (2, ["--print-schedule=yes"], "--print-schedule"),
        (2, ["--dry-run", "--schedule", "zb-v", "--micro-batches", "2"], "--micro-batches"),
        # 5 ranks x 858993460 chunks = 2^32 + 4 virtual stages: 4 in an int, which divides 8 layers
        (5, ["--schedule", "interleaved", "--virtual-stages", "858993460", "--micro-batches", "5", "--batch", "10"],
         "4294967300 virtual stages"),
        # 2 x 8 virtual stages x 2048 micro-batches = 32768 messages, one MPI tag each: more than MPI guarantees
        (2, TAGS_OVER, "--micro-batches 2048"),
        (2, ["--dry-run"] + TAGS_OVER, "--micro-batches 2048"),
        (2, ["--print-schedule"] + TAGS_OVER, "--micro-batches 2048"),
    ] + NO_TP,
    "lab05_tp": [
        (3, [], "--heads"),  # 3 does not divide 4 heads
        (2, ["--heads", "1", "--d-model", "64"], "--heads"),
        (4, ["--heads", "2"], "--heads"),
        # "t divides the MLP width 4C" and "t divides C" cannot fail on their
        # own: t | heads and heads | C (checked first) imply both.
        (2, ["--check-sync=yes"], "--check-sync"),
        (2, ["--sequence-parallel", "--seq", "63"], "--seq"),  # T/t positions of every sequence per rank
        (4, ["--sequence-parallel", "--seq", "66"], "--seq"),
        (1, ["--sequence-parallel"], "--sequence-parallel"),  # t = 1: nothing to split
        (2, ["--sequence-parallel=yes"], "--sequence-parallel"),
        (3, ["--dry-run"], "--heads"),
    ] + NO_EXPERTS,
    "lab06_3d": [
        (4, ["--tp", "2", "--pp", "2", "--dp", "2"], "--dp"),  # 8 slots for 4 ranks
        (4, ["--tp", "4", "--pp", "1", "--dp", "1", "--heads", "2"], "--tp"),
        (4, ["--tp", "1", "--pp", "4", "--dp", "1", "--layers", "3"], "--layers"),
        (4, ["--tp", "0", "--pp", "2", "--dp", "2"], "--tp"),
        # lab04's schedule flags, checked at the grid's pipeline depth
        (4, ["--tp", "2", "--pp", "2", "--dp", "1", "--schedule", "interleaved", "--virtual-stages", "3"], "--layers"),
        (4, ["--tp", "2", "--pp", "2", "--dp", "1", "--schedule", "zb-h1", "--micro-batches", "1"], "--micro-batches"),
        (4, ["--tp", "1", "--pp", "2", "--dp", "2", "--schedule", "1f1b", "--virtual-stages", "2"], "--virtual-stages"),
        # checkpoints at the 2 x 2 x 1 grid: refused on all four ranks before the
        # grid is built (test_checkpoint.py resume_lab06: a file of another shape)
        (4, ["--tp", "2", "--pp", "2", "--dp", "1", "--resume", "/nonexistent/ck.safetensors"], "--resume"),
        (4, ["--tp", "2", "--pp", "2", "--dp", "1", "--resume", EMPTY], EMPTY),
        (4, ["--tp", "2", "--pp", "2", "--dp", "1", "--save", A_FOLDER], "--save"),
        (2, ["--check-sync=yes"], "--check-sync"),
        (4, ["--tp", "2", "--pp", "2", "--dp", "1", "--sequence-parallel", "--seq", "63"], "--seq"),
        (4, ["--tp", "1", "--pp", "2", "--dp", "2", "--sequence-parallel"], "--sequence-parallel"),  # no TP group
        (4, ["--tp", "2", "--pp", "2", "--dp", "2", "--dry-run"], "--dp"),
        (4, ["--tp", "1", "--pp", "2", "--dp", "2", "--batch", "4096"] + TAGS_OVER[:-2], "--micro-batches 2048"),
        (4, ["--tp", "1", "--pp", "2", "--dp", "2", "--batch", "4096", "--dry-run"] + TAGS_OVER[:-2],
         "--micro-batches 2048"),
    ] + NO_EXPERTS,
    "lab07_cp": [
        (4, ["--cp", "3"], "--cp"),  # 3 does not divide 4 ranks
        (2, ["--cp", "-1"], "--cp"),
        (2, ["--cp-layout", "striped"], "--cp-layout"),
        (2, ["--cp-algo", "ulysses2"], "--cp-algo"),
        (2, ["--seq", "30"], "--seq"),  # zig-zag: 2N = 4 chunks
        (3, ["--seq", "64", "--cp-layout", "contiguous"], "--seq"),  # N = 3 chunks
        (4, ["--cp", "2", "--batch", "3"], "--batch"),  # 2 data-parallel groups
        (3, ["--dry-run", "--seq", "64", "--cp-layout", "contiguous"], "--seq"),
        (3, ["--cp-algo", "ulysses", "--seq", "66"], "--cp-algo"),  # 4 heads over 3 ranks
        (2, ["--cp-algo", "ulysses", "--heads", "3", "--d-model", "36"], "--cp-algo"),
        (4, ["--cp-algo", "ulysses", "--cp", "4", "--heads", "2", "--dry-run"], "--cp-algo"),
        (2, ["--max-memory-mb", "-1"], "--max-memory-mb"),
        (2, ["--max-memory-mb", "0.5"], "--max-memory-mb"),  # the default run's predicted peak is over it
    ] + NO_EXPERTS + NO_TP,
    "lab09_5d": [
        (4, ["--tp", "2", "--cp", "2", "--pp", "2"], "--pp"),  # 8 slots for 4 ranks
        (4, ["--tp", "2", "--cp", "2", "--pp", "2", "--dry-run"], "--pp"),
        (2, ["--cp", "-1"], "--cp"),
        (2, ["--cp-layout", "striped"], "--cp-layout"),
        (2, ["--cp-algo", "ulysses2"], "--cp-algo"),
        (4, ["--tp", "1", "--cp", "2", "--pp", "2", "--seq", "30"], "--seq"),  # zig-zag: 2c = 4 chunks
        (3, ["--tp", "1", "--cp", "3", "--pp", "1", "--seq", "64", "--cp-layout", "contiguous"], "--seq"),
        # Ulysses splits a TP rank's heads over the CP ranks: 2 heads over t x c = 4
        (4, ["--tp", "2", "--cp", "2", "--pp", "1", "--cp-algo", "ulysses", "--heads", "2", "--d-model", "32"],
         "--heads"),
        (4, ["--tp", "1", "--cp", "1", "--pp", "2", "--dp", "2", "--batch", "6"], "--batch"),  # 2 x 4 micro-batches
        (4, ["--tp", "1", "--cp", "1", "--pp", "4", "--layers", "3"], "--layers"),
        (4, ["--tp", "4", "--cp", "1", "--pp", "1", "--heads", "2"], "--tp"),
        (2, ["--tp", "2", "--cp", "1", "--zero-stage", "1"], "--zero-stage"),  # c x d = 1: nothing to shard over
        (2, ["--zero-stage", "2"], "--zero-stage"),
        (4, ["--tp", "1", "--cp", "2", "--pp", "2", "--schedule", "zb-h1", "--micro-batches", "1"], "--micro-batches"),
        (4, ["--tp", "1", "--cp", "2", "--pp", "2", "--resume", "/nonexistent/ck.safetensors"], "--resume"),
        (2, ["--check-sync=yes"], "--check-sync"),
        (2, ["--tp", "1", "--cp", "2", "--sequence-parallel"], "--sequence-parallel"),  # no TP group
        # lab08's experts on the grid: e dividing the stage's t x c x d ranks and the experts, the fused backward
        (2, ["--tp", "1", "--dp", "2", "--ep", "2"], "--ep"),  # no experts to spread
        (4, ["--tp", "1", "--cp", "1", "--pp", "2", "--dp", "2", "--experts", "4", "--ep", "4"], "--ep 4"),
        (4, ["--tp", "1", "--cp", "1", "--pp", "1", "--dp", "4", "--experts", "6", "--ep", "4"], "--ep 4"),
        (4, ["--tp", "2", "--cp", "1", "--pp", "2", "--dp", "1", "--experts", "4", "--ep", "4",
             "--sequence-parallel"], "--ep 4"),  # 4 does not divide the stage's t x c x d = 2 ranks
        # ZeRO-1 with experts shards over the replicas and EDP: none to shard over at c x d = 1
        (4, ["--tp", "1", "--cp", "1", "--pp", "4", "--dp", "1", "--experts", "4", "--zero-stage", "1"], "--zero-stage"),
        (4, ["--tp", "1", "--cp", "1", "--pp", "2", "--dp", "2", "--experts", "4", "--schedule", "zb-h1"], "--schedule"),
        # SP splits a CP rank's T/c positions t ways: 24 positions, 4 contiguous chunks of 6, not 4 x 2
        (4, ["--tp", "2", "--cp", "2", "--pp", "1", "--sequence-parallel", "--cp-layout", "contiguous", "--seq", "6"],
         "--sequence-parallel"),
    ],
    "lab08_ep": [
        (4, ["--ep", "3"], "--ep"),  # 3 does not divide 4 ranks
        (2, ["--ep", "-1"], "--ep"),
        (3, ["--batch", "12"], "--experts"),  # the default E = 4 over --ep 3
        (4, ["--ep", "2", "--experts", "6", "--top-k", "7"], "--top-k"),  # k > E
        (2, ["--top-k", "5"], "--top-k"),  # k > the default E = 4
        (2, ["--capacity-factor", "-1"], "--capacity-factor"),
        (2, ["--experts", "0"], "--experts"),
        (4, ["--batch", "6"], "--batch"),  # each rank trains its own rows
        (4, ["--dry-run", "--ep", "3"], "--ep"),  # the dry run checks what the run would
    ] + NO_TP,
}

# ---- sizes refused before allocation (issue 31) --------------------------------------------------------
# theory/predict's floor per rank (labs/lab_run.c lab_start) against the machine's memory, or --max-memory-mb:
# one line naming the flags that size the run, status 2, nothing created, before anything is allocated (today's
# code allocated, printed and created --out first, or filled a position table for minutes)
SIZES = [
    (2, ["--seq", "1000000000"], "--seq 1000000000 is longer than the built-in corpus"),  # as a --data file does
    (2, ["--seq", "200000"], "--seq 200000"),  # within the corpus; its T^2 attention is terabytes
    (2, ["--layers", "1000000000"], "--layers 1000000000"),
    (2, ["--d-model", "1000000000"], "--d-model 1000000000"),  # 10^19 elements a matrix: past a 64-bit count
    (2, ["--batch", "1000000000"], "--batch 1000000000"),
    (2, ["--max-memory-mb", "1"], "--max-memory-mb 1:"),  # every lab's default run needs more a rank
    (2, ["--max-memory-mb", "-1"], "--max-memory-mb"),
    (2, ["--max-memory-mb", "2e9"], "--max-memory-mb"),  # over a PiB a rank: more than the check can bound
    (2, ["--dry-run", "--seq", "200000"], "--seq 200000"),  # the dry run refuses what the machine cannot hold
    # a cap plans for another machine: a dry run is refused when it fits neither
    (2, ["--dry-run", "--d-model", "1000000000", "--max-memory-mb", "1000"], "--max-memory-mb 1000:"),
]
# the labs whose layers run experts (the others refuse the flag itself)
SIZES_EXPERTS = [(2, ["--experts", "1000000000"], "--experts 1000000000"),
                 (2, ["--experts", "4", "--expert-width", "1000000000"], "--expert-width 1000000000"),
                 (2, ["--experts", "4", "--shared-experts", "1000000000"], "--shared-experts 1000000000")]


def main(lab):
    check(os.path.exists(program(lab)), f"{program(lab)} is not built")
    # the labs that take --experts predict them in their dry run (theory/predict.c, lab08's
    # theory/expert_parallel.c; tests/test_cluster.py dry_run holds the figures to a run's); lab05-lab07
    # refuse the flag, --dry-run or not
    cases = [c for c in SHARED if lab not in DRY_RUN_EXPERTS or c[1] != ["--dry-run", "--experts", "4"]] + PER_LAB[lab]
    if lab != "lab08_ep":
        cases += DENSE_DEPENDENT
    cases += SIZES + (SIZES_EXPERTS if lab in DRY_RUN_EXPERTS else [])
    if not has_gpu(lab):
        cases.append((2, ["--device", "cuda"], "--device cuda"))
    # every rank reads --data itself: two ranks that see different bytes under one name
    # (each starts in a folder of its own, where corpus.txt differs) must not train
    folders = tempfile.mkdtemp(prefix="pl-data-")
    for r, text in enumerate(["the cat sees the dog. " * 40, "the dog sees the cat. " * 40]):
        os.mkdir(os.path.join(folders, f"r{r}"))
        with open(os.path.join(folders, f"r{r}", "corpus.txt"), "w") as f:
            f.write(text)
    cases.append((2, ["--data", "corpus.txt"], "different bytes", f'cd "{folders}/r$PMI_RANK" && '))
    def one(case):
        n, args, needle, *prefix = case
        if lab == "lab06_3d" and not any(a in ("--tp", "--pp", "--dp") for a in args):
            args = ["--tp", "1", "--pp", "1", "--dp", str(n)] + args  # a grid that fits n ranks
        out = os.path.join(tempfile.mkdtemp(prefix="pl-bad-"), "never-created")
        check_rejected(lab, n, args if "--out" in args else args + ["--out", out], needle, *prefix)
        check(not os.path.exists(out), f"{lab} {args}: a rejected run created {out}")

    # two cases at a time: a rejected run mostly waits (the launcher's start-up and exit), and the
    # 5 s bound of each has room for a neighbour on 2 cores; the first failure ends the test
    for n in sorted({c[0] for c in cases}):
        startup_seconds(lab, n)  # measured alone, before the cases share the cores
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, cases))
    left = sorted(set(os.listdir(SPECIAL)) - {"fifo", "huge"})
    check(not left, f"{lab}: rejected runs left files behind: {left}")
    print(f"{lab}: {len(cases)} bad inputs rejected with status 2, one line, nothing left behind")


def tags_boundary():
    """What --dry-run approves runs: lab04 at the last micro-batch count whose
    messages fit MPI's tags (2 ranks x 4 chunks x 2046 = 32736 messages; 2048 is
    refused above, by the run and the dry run alike) plans and trains a step."""
    args = ["--layers", "8", "--d-model", "32", "--heads", "2", "--seq", "16", "--steps", "1", "--schedule",
            "interleaved", "--virtual-stages", "4", "--micro-batches", "2046", "--batch", "2046"]
    out = os.path.join(tempfile.mkdtemp(prefix="pl-tags-"), "dry")
    rec, p, _ = run("lab04_1f1b", 2, args + ["--dry-run"], out=out)
    check(p.returncode == 0 and "dry run" in p.stdout and not os.path.exists(out), "the dry run approves, creates nothing")
    rec, p, _ = run("lab04_1f1b", 2, args, timeout=300)
    check(rec["micro_batches"] == 2046 and rec["chunks_per_rank"] == 4 and len(rec["losses"]) == 1,
          f"the run it approved trained: {rec and rec['layout']}")
    print("the last tag-space layout the dry run approves runs")


if __name__ == "__main__":
    if sys.argv[1] == "tags_boundary":
        tags_boundary()
    else:
        main(sys.argv[1])
    print("passed")
