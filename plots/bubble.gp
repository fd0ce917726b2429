# Chart 1: the pipeline bubble against the number of micro-batches m, measured
# (lab03 naive, lab04 GPipe and 1F1B) beside the theory, one panel per stage count p.
#
# Reads bubble.tsv, written by records_to_tsv.py from any records.jsonl:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='bubble.tsv'; out='bubble'; fmt='png'" ../plots/bubble.gp
# Variables (all optional): src [bubble.tsv], out [bubble] (file name without
# extension), fmt [png] (png or svg).
if (!exists("src")) src = "bubble.tsv"
if (!exists("out")) out = "bubble"
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

ps = meta("ps")
stats src using 3 nooutput
mmax = STATS_max

note = meta("note")
set multiplot title "Pipeline bubble against micro-batches: measured (points) and theory (lines)\n".meta("subtitle").(note eq "" ? "" : "\n".note) font ",13"
set logscale x 2
set xrange [0.8 : mmax * 1.25]
set xtics 2
set yrange [0 : 1.05]
set xlabel "micro-batches per step, m"
set ylabel "bubble = 1 - busy time / step time"
set grid
# panels side by side on the left, one legend on the right
np = words(ps)
pw = (0.72 - 0.07 * np) / np
set tmargin at screen 0.80
set bmargin at screen 0.11
set bars small
do for [i = 1 : words(ps)] {
    p = word(ps, i) + 0
    set lmargin at screen 0.07 + (i - 1) * (pw + 0.07)
    set rmargin at screen 0.07 + (i - 1) * (pw + 0.07) + pw
    if (i == 1) { set key at screen 0.735, 0.80 left top Left reverse samplen 3 spacing 1.3 title "measured: mean over ranks,\nbar from min to max" } else { unset key }
    set title sprintf("p = %d stages", p)
    plot src using ($1 == p && strcol(2) eq "gpipe" ? $3 / 1.05 : NaN):5:6:7 with yerrorlines pt 7 ps 1.2 lw 2 lc rgb "#4c72b0" title "GPipe (lab04)", \
         src using ($1 == p && strcol(2) eq "1f1b" ? $3 * 1.05 : NaN):5:6:7 with yerrorlines pt 9 ps 1.4 lw 2 lc rgb "#c44e52" title "1F1B (lab04)", \
         src using ($1 == p && strcol(2) eq "naive" ? $3 : NaN):5:6:7 with yerrorbars pt 4 ps 2.2 lw 2 lc rgb "#555555" title "naive (lab03)", \
         (x >= 1 ? (p - 1.0) / p : NaN) lw 2 dt 3 lc rgb "#7f7f7f" title "theory, naive: (p-1)/p", \
         (x >= 1 ? (p - 1.0) / (x + p - 1) : NaN) lw 2 dt 2 lc rgb "#222222" title "theory, GPipe and 1F1B: (p-1)/(m+p-1)"
}
unset multiplot
