# Long sequences under context parallelism (lab07_cp): the activation peak per
# rank and the step time against T at CP = 1, 2, 4 (zig-zag ring), and each
# rank's attention kernel time at CP = 4 and the longest T, zig-zag against
# contiguous chunks.
#
# Reads cpseq.tsv, written by records_to_tsv.py from lab07 records:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='cpseq.tsv'; out='cpseq'; fmt='png'" ../plots/cpseq.gp
# Variables (all optional): src [cpseq.tsv], out [cpseq], fmt [png] (png or svg).
if (!exists("src")) src = "cpseq.tsv"
if (!exists("out")) out = "cpseq"
if (!exists("fmt")) fmt = "png"
meta(k) = system(sprintf("sed -n 's/^# %s: //p' '%s' | head -n 1", k, src))
if (fmt eq "svg") {
    set terminal svg size 1500,560 dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1500,560 font "DejaVu Sans,11"
}
set output out.".".fmt
set datafile separator "\t"
set datafile columnheaders
set termoption noenhanced
set linetype 1 lc rgb "#4c72b0" pt 7 ps 1.2 lw 2
set linetype 2 lc rgb "#dd8452" pt 5 ps 1.2 lw 2
set linetype 3 lc rgb "#55a868" pt 9 ps 1.4 lw 2
# columns: 1 run, 2 cp, 3 layout, 4 T, 5 acts_measured, 6 acts_formula, 7 step_ms, 8 imbalance_row, 9-12 att_ms_r0..3
zig(col, n) = (strcol(3) eq "zigzag" && column(2) == n) ? column(col) : 1/0

set multiplot layout 1,3 title "Context parallelism as the sequence grows\n".meta("subtitle") font ",13"
set grid
set key top left Left reverse samplen 2 box opaque
set logscale x 2
set xlabel "sequence length T"

set logscale y 2
set ylabel "activation peak per rank (MB = 10^6 bytes)"
set title "activations per rank: measured (points), formula (lines)"
plot for [i=1:3] src using 4:(zig(5, 2**(i-1)) / 1e6) with points lt i title sprintf("CP = %d", 2**(i-1)), \
     for [i=1:3] src using 4:(zig(6, 2**(i-1)) / 1e6) with lines lt i notitle
unset logscale y

set ylabel "median step time (ms)"
set yrange [0:*]
set title "step time"
plot for [i=1:3] src using 4:(zig(7, 2**(i-1))) with linespoints lt i title sprintf("CP = %d", 2**(i-1))

unset logscale x
set xlabel "CP rank (CP = 4, the longest T)"
set ylabel "attention kernels per step (ms)"
set title "per-rank attention: contiguous against zig-zag"
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.38 absolute
set xrange [-0.6:3.6]
set yrange [0:*]
set xtics ("rank 0" 0, "rank 1" 1, "rank 2" 2, "rank 3" 3)
unset grid
set grid y
# the two rows marked imbalance_row: one pair of bars per rank
row(layout, c) = (strcol(3) eq layout && column(8) == 1) ? column(c) : 1/0
plot for [r=0:3] src using (r - 0.2):(row("contiguous", 9 + r)) with boxes lt 2 title (r == 0 ? "contiguous" : ""), \
     for [r=0:3] src using (r + 0.2):(row("zigzag", 9 + r)) with boxes lt 1 title (r == 0 ? "zig-zag" : "")
unset multiplot
