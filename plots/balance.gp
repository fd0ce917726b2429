# Balancing the experts (lab08 part 3): the worst layer's max/mean choices per
# expert and the loss over the steps, for each routing (--router, --balance,
# --bias-speed) of lab01_dp -n 1 with experts.
#
# Reads balance.tsv, written by records_to_tsv.py from such records:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='balance.tsv'; out='balance'; fmt='png'" ../plots/balance.gp
# Variables (all optional): src [balance.tsv], out [balance], fmt [png] (png or svg).
if (!exists("src")) src = "balance.tsv"
if (!exists("out")) out = "balance"
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
set linetype 1 lc rgb "#4c72b0" pt 7 ps 0.8 lw 2
set linetype 2 lc rgb "#dd8452" pt 5 ps 0.8 lw 2
set linetype 3 lc rgb "#55a868" pt 9 ps 0.9 lw 2
set linetype 4 lc rgb "#c44e52" pt 11 ps 0.9 lw 2
set linetype 5 lc rgb "#8172b3" pt 13 ps 0.9 lw 2
# columns: 1 step, then for run i: 2i load (max/mean), 2i+1 loss; the header names the routing;
# meta baseline: the run the right panel subtracts (softmax with the aux loss)
n = int(meta("series"))
name(i) = columnhead(2 * i)[1:strlen(columnhead(2 * i)) - 5]

set multiplot layout 1,2 title "Balancing the experts: aux loss against bias\n".meta("subtitle") font ",13"
set grid
set key top right samplen 2 box opaque
set xlabel "step"
set ylabel "worst layer's max/mean choices per expert"
set yrange [1:*]
unset key
set title "load imbalance (1: every expert as busy as the mean; key on the right)"
plot for [i=1:n] src using 1:(column(2 * i)) with linespoints lt i title name(i)

b = int(meta("baseline"))
set key outside right top vertical samplen 2 box
set ylabel "loss - the ".meta("baseline_name")." run's loss"
set yrange [*:*]
set title "loss against Switch's routing (the aux runs include their aux term, about 0.01)"
plot for [i=1:n] src using 1:(column(2 * i + 1) - column(2 * b + 1)) with lines lt i title name(i)
unset multiplot
