# The bf16 chart: lab01 -n 1 in fp32 (the baseline) and with --precision bf16,
# the loss of every step (top) and their relative difference (bottom), against
# the 2 % the tests allow. loss.gp draws it, on precision.tsv and that bound.
#
# Reads precision.tsv, written by records_to_tsv.py from records holding both runs:
#   mpirun -n 1 ./lab01_dp --steps 10 --out mine
#   mpirun -n 1 ./lab01_dp --steps 10 --precision bf16 --out mine
#   python3 ../plots/records_to_tsv.py mine/records.jsonl --out mine
#   cd mine && gnuplot -e "fmt='png'" ../../plots/precision.gp
# Variables (all optional): src [precision.tsv], out [precision], fmt [png].
if (!exists("src")) src = "precision.tsv"
if (!exists("out")) out = "precision"
tol = 2e-2
heading = "Loss of bf16 mixed precision over fp32"
load ARG0[1 : strstrt(ARG0, "precision.gp") - 1]."loss.gp"
