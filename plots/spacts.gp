# Activation memory per rank of lab05 under tensor parallelism (t = 1, 2, 4),
# sequence parallelism and recomputation, stacked by kind as the allocator lays
# the block out, with theory.h's formula as points (Korthikanti et al. 2022's
# Figure, measured on this model).
#
# Reads spacts.tsv, written by records_to_tsv.py from lab05 records:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='spacts.tsv'; out='spacts'; fmt='png'" ../plots/spacts.gp
# Variables (all optional): src [spacts.tsv], out [spacts], fmt [png] (png or svg).
if (!exists("src")) src = "spacts.tsv"
if (!exists("out")) out = "spacts"
if (!exists("fmt")) fmt = "png"
meta(k) = system(sprintf("sed -n 's/^# %s: //p' '%s' | head -n 1", k, src))
if (fmt eq "svg") {
    set terminal svg size 1200,700 dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1200,700 font "DejaVu Sans,11"
}
set output out.".".fmt
set datafile separator "\t"
set datafile columnheaders
set termoption noenhanced

set title "Activation memory per rank: tensor parallelism, sequence parallelism, recomputation\n".meta("subtitle") font ",13"
set ylabel "peak activation bytes per rank (MB = 10^6 bytes)"
set xlabel "run (t = tensor-parallel degree); label: the share of the T^2 term by the formula" offset 0, -0.6
set bmargin 7
set style data histograms
set style histogram rowstacked
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.7
stats src using 5 nooutput
set xrange [-0.6 : STATS_records - 0.4]
set yrange [0 : *]
set offsets 0, 0, graph 0.08, 0
set grid y
set key inside right top Left reverse samplen 2 spacing 1.3 box opaque
set xtics rotate by -35 left
set linetype 11 lc rgb "#c44e52"
set linetype 12 lc rgb "#4c72b0"
set linetype 13 lc rgb "#c8c8c8"
names = "'per layer: att [B,H/t,T,T] (the T^2 term)' 'per layer: the other pieces (linear in T)' 'not per layer: x_in, tokens, the head'"
plot for [c = 5 : 7] src using (column(c) / 1e6):xtic(sprintf("%s, t=%d", strcol(1), column("t"))) lt c + 6 title word(names, c - 4), \
     src using 0:(column("formula") / 1e6) with points pt 7 ps 1.6 lc rgb "#000000" title "formula (theory.h), per rank", \
     src using 0:(column("formula") / 1e6):(column("quadratic_share") > 0 ? sprintf("%.0f%%", 100 * column("quadratic_share")) : "") with labels offset 0, 1.0 notitle
