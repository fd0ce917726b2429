# Chart 1: the pipeline bubble against the number of micro-batches m, measured
# (lab03 naive, lab04's schedules) beside the theory, one panel per stage count p:
# lines the textbook figures on unit times, open markers each zero-bubble run's
# formula on its own measured t_F, t_B, t_W.
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
    set terminal svg size 1300,760 dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1300,760 font "DejaVu Sans,11"
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
    if (i == 1) { set key at screen 0.735, 0.80 left top Left reverse samplen 3 spacing 1.1 font ",10" title "measured: mean over ranks,\nbar from min to max" } else { unset key }
    set title sprintf("p = %d stages", p)
    # each schedule's points a little apart on the log axis, so equal bubbles stay visible
    plot src using ($1 == p && strcol(2) eq "naive" ? $3 : NaN):5:6:7 with yerrorbars pt 4 ps 2.2 lw 2 lc rgb "#555555" title "naive (lab03)", \
         src using ($1 == p && strcol(2) eq "gpipe" ? $3 / 1.08 : NaN):5:6:7 with yerrorlines pt 7 ps 1.2 lw 2 lc rgb "#4c72b0" title "GPipe", \
         src using ($1 == p && strcol(2) eq "1f1b" ? $3 / 1.03 : NaN):5:6:7 with yerrorlines pt 9 ps 1.4 lw 2 lc rgb "#c44e52" title "1F1B", \
         src using ($1 == p && strcol(2) eq "interleaved" ? $3 * 1.03 : NaN):5:6:7 with yerrorlines pt 5 ps 1.2 lw 2 lc rgb "#8172b3" title "interleaved, v = 2", \
         src using ($1 == p && strcol(2) eq "zb-h1" ? $3 * 1.08 : NaN):5:6:7 with yerrorlines pt 11 ps 1.4 lw 2 lc rgb "#55a868" title "ZB-H1", \
         src using ($1 == p && strcol(2) eq "zb-v" ? $3 * 1.13 : NaN):5:6:7 with yerrorlines pt 13 ps 1.4 lw 2 lc rgb "#dd8452" title "ZB-V", \
         src using ($1 == p && strcol(2) eq "zb-h1" ? $3 * 1.08 : NaN):9 with points pt 10 ps 1.6 lc rgb "#55a868" title "formula on measured times", \
         src using ($1 == p && strcol(2) eq "zb-v" ? $3 * 1.13 : NaN):9 with points pt 12 ps 1.6 lc rgb "#dd8452" notitle, \
         (x >= 1 ? (p - 1.0) / p : NaN) lw 2 dt 3 lc rgb "#7f7f7f" title "theory, naive: (p-1)/p", \
         (x >= 1 ? (p - 1.0) / (x + p - 1) : NaN) lw 2 dt 2 lc rgb "#222222" title "GPipe, 1F1B: (p-1)/(m+p-1)", \
         (x >= p ? (p - 1.0) / (2 * x + p - 1) : NaN) lw 2 dt 2 lc rgb "#8172b3" title "interleaved: (p-1)/(vm+p-1)", \
         (x >= p ? (p - 1.0) / (3 * x + p - 1) : NaN) lw 2 dt 2 lc rgb "#55a868" title "ZB-H1 (unit times): (p-1)/(3m+p-1)", \
         (x >= 2 * p - 1 ? (p - 1.0) / (6 * x + p - 1) : NaN) lw 2 dt 2 lc rgb "#dd8452" title "ZB-V (unit times): (p-1)/(6m+p-1)"
}
unset multiplot
