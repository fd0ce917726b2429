# Chart 3b: activation memory of GPipe against 1F1B as the micro-batches m grow:
# left with the global batch fixed, right with the micro-batch size fixed.
#
# Reads acts.tsv, written by records_to_tsv.py from any records.jsonl with lab04 runs:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='acts.tsv'; out='acts'; fmt='png'" ../plots/acts.gp
# Variables (all optional): src [acts.tsv], out [acts], fmt [png] (png or svg).
if (!exists("src")) src = "acts.tsv"
if (!exists("out")) out = "acts"
if (!exists("fmt")) fmt = "png"
meta(k) = system(sprintf("sed -n 's/^# %s: //p' '%s' | head -n 1", k, src))
if (fmt eq "svg") {
    set terminal svg size 1300,620 dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1300,620 font "DejaVu Sans,11"
}
set output out.".".fmt
set datafile separator "\t"
set datafile columnheaders
set termoption noenhanced

p = meta("p") + 0
B = meta("fixed_batch") + 0
b = meta("fixed_rows") + 0
stats src using 3 nooutput
mmax = STATS_max

set multiplot title "Activation memory of the busiest stage: GPipe against 1F1B as the micro-batches grow\n".meta("subtitle")." (points: measured by the allocator, lines: the schedule's formula)" font ",13"
set xrange [0.5 : mmax + 0.5]
set xtics 1
if (mmax > 16) { set xtics autofreq }
set yrange [0 : *]
set offsets 0, 0, graph 0.05, 0
set xlabel "micro-batches per step, m"
set ylabel "peak activation bytes, max over stages (MB)"
set grid
set tmargin at screen 0.82
set bmargin at screen 0.11
set key at screen 0.735, 0.80 left top Left reverse samplen 3 spacing 1.4
do for [i = 1 : 2] {
    set lmargin at screen 0.06 + (i - 1) * 0.37
    set rmargin at screen 0.06 + (i - 1) * 0.37 + 0.29
    if (i == 2) {
        unset key
        set arrow 1 from p, graph 0 to p, graph 1 nohead dt 3 lc rgb "#555555"
        set label 1 " m = p" at p, graph 0.95 left
    }
    series = i == 1 ? "batch" : "micro"
    set title (i == 1 ? sprintf("global batch fixed at %d sequences (micro-batch B/m)", B) : sprintf("micro-batch fixed at %d sequences (global batch %d m)", b, b))
    sel(s) = strcol(1) eq series && strcol(2) eq s
    plot src using (sel("gpipe") ? $3 : NaN):($7 / 1e6) with lines lw 2 dt 2 lc rgb "#4c72b0" title "GPipe formula: m micro-batches", \
         src using (sel("gpipe") ? $3 : NaN):($6 / 1e6) with points pt 7 ps 1.5 lc rgb "#4c72b0" title "GPipe measured", \
         src using (sel("1f1b") ? $3 : NaN):($7 / 1e6) with lines lw 2 dt 2 lc rgb "#c44e52" title sprintf("1F1B formula: min(m, p-r), p = %d", p), \
         src using (sel("1f1b") ? $3 : NaN):($6 / 1e6) with points pt 9 ps 1.7 lc rgb "#c44e52" title "1F1B measured"
}
unset multiplot
