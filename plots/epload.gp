# Expert parallelism (lab08_ep): the busiest expert's load over the steps at
# three aux-loss weights, and the all-to-all's bytes and time per step against
# the EP degree N.
#
# Reads epload.tsv, written by records_to_tsv.py from lab08 records:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='epload.tsv'; out='epload'; fmt='png'" ../plots/epload.gp
# Variables (all optional): src [epload.tsv], out [epload], fmt [png] (png or svg).
if (!exists("src")) src = "epload.tsv"
if (!exists("out")) out = "epload"
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
# columns: 1 run, 2 kind, 3 aux, 4 ep, 5 step, 6 load_ratio, 7 a2a_sent, 8 a2a_uniform, 9 a2a_ms, 10 experts_ms
auxes = "0 0.01 0.1"
load(a) = (strcol(2) eq "load" && abs(column(3) - a) < 1e-9) ? column(6) : 1/0
scale(c) = strcol(2) eq "scale" ? column(c) : 1/0

set multiplot layout 1,3 title "Expert parallelism: load and all-to-all\n".meta("subtitle") font ",13"
set grid
set key top right samplen 2 box opaque

set xlabel "step"
set ylabel "busiest expert's tokens / uniform mean"
set yrange [1:*]
set title "expert load (-n 4, --ep 4)"
plot for [i=1:3] src using 5:(load(real(word(auxes, i)))) with linespoints lt i \
     title sprintf("aux-loss-coef %s", word(auxes, i))

set xlabel "EP degree N (global batch fixed)"
set xtics 1
set yrange [0:*]
set ylabel "bytes that left a rank per step (MB = 10^6)"
set title "all-to-all bytes: routing (points), uniform formula (line)"
set key top left
plot src using 4:(scale(7) / 1e6) with points lt 1 title "exact from the routing", \
     src using 4:(scale(8) / 1e6) with lines lt 2 title "4 k N_tok C b (N-1)/N x L"

set ylabel "ms per step (rank 0)"
set title "time: all-to-all against the experts' matmuls"
plot src using 4:(scale(9)) with linespoints lt 1 title "all-to-all (waits included)", \
     src using 4:(scale(10)) with linespoints lt 3 title "experts' matmuls"
unset multiplot
