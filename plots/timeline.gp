# Chart 2: pipeline timelines per rank (Gantt), one panel per timeline CSV, on a
# common time axis: forward, backward, weight half, other compute, communication and idle.
#
# Reads the timeline CSVs the labs write beside their records
# (rank,start_us,end_us,op,kind,micro_batch,step), no conversion needed:
#   gnuplot -e "src='runs/lab04_1f1b_pp_4_m_8_1f1b_timeline.csv'" plots/timeline.gp
#   gnuplot -e "src='a_timeline.csv b_timeline.csv'; names=\"'GPipe' '1F1B'\"; out='gantt'" plots/timeline.gp
# Variables (all optional): src [timeline.csv] (one or more files, separated by
# spaces), names (a title per file, in single quotes; default: the file name),
# step [-1: the last step of each file], note (a line under the subtitle),
# out [timeline], fmt [png] (png or svg).
if (!exists("src")) src = "timeline.csv"
if (!exists("names")) names = ""
if (!exists("step")) step = -1
if (!exists("note")) note = ""
if (!exists("out")) out = "timeline"
if (!exists("fmt")) fmt = "png"
n = words(src)
if (fmt eq "svg") {
    set terminal svg size 1400, 220 + 240 * n dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1400, 220 + 240 * n font "DejaVu Sans,11"
}
set output out.".".fmt
set datafile separator ","
set datafile columnheaders
set termoption noenhanced

c_fwd = "#4c72b0"; c_bwd = "#55a868"; c_wgt = "#dd8452"; c_other = "#8172b3"; c_comm = "#c44e52"; c_idle = "#e6e6e6"

# each file's step, its start, its length and its ranks; the longest sets the axis
array S[n]; array T0[n]; array MS[n]; array R[n]
span = 0
do for [i = 1 : n] {
    f = word(src, i)
    stats f using 7 nooutput
    S[i] = step >= 0 ? step : int(STATS_max)
    stats f using ($7 == S[i] ? $2 : NaN) nooutput
    T0[i] = STATS_min
    stats f using ($7 == S[i] ? $3 : NaN) nooutput
    MS[i] = (STATS_max - T0[i]) / 1000.0
    stats f using 1 nooutput
    R[i] = int(STATS_max) + 1
    span = MS[i] > span ? MS[i] : span
}
title_of(i) = words(names) >= i ? word(names, i) : system(sprintf("basename '%s' _timeline.csv", word(src, i)))

set multiplot title "Pipeline timelines per rank: one training step\n".(note eq "" ? "" : note."\n") font ",13"
h = 0.84 / n
set xrange [0 : span * 1.01]
set ylabel "rank"
set ytics 1 nomirror
set grid x
set style fill solid 1.0 noborder
set lmargin at screen 0.06
set rmargin at screen 0.97
do for [i = 1 : n] {
    f = word(src, i)
    set tmargin at screen 0.90 - (i - 1) * h - 0.05
    set bmargin at screen 0.90 - i * h + 0.045
    set yrange [R[i] - 0.5 : -0.5]
    set xlabel (i == n ? "time since the step started (ms)" : "")
    set title sprintf("%s: step %d, %.1f ms", title_of(i), S[i], MS[i])
    # idle: the whole step behind every rank; what a rank does is drawn over it
    unset object
    do for [r = 0 : R[i] - 1] {
        set object r + 1 rect from 0, r - 0.38 to MS[i], r + 0.38 fc rgb c_idle fs solid 1.0 noborder behind
    }
    if (i == 1) { set key at screen 0.06, 0.91 left bottom Left reverse horizontal maxrows 2 width 2 samplen 2 spacing 1.2 } else { unset key }
    x0(t) = (t - T0[i]) / 1000.0
    is(k, o) = column(7) == S[i] && strcol(5) eq k && (o eq "" || strcol(4) eq o)
    other(d) = column(7) == S[i] && strcol(5) eq "compute" && strcol(4) ne "forward" && strcol(4) ne "backward" && strcol(4) ne "backward_weight"
    fb(d) = column(7) == S[i] && (strcol(4) eq "forward" || strcol(4) eq "backward" || strcol(4) eq "backward_weight")
    letter(d) = strcol(4) eq "forward" ? "F" : strcol(4) eq "backward" ? "B" : "W"
    plot f using (is("comm", "") ? x0(($2 + $3) / 2) : NaN):1:(($3 - $2) / 2000.0):(0.30) with boxxyerror lc rgb c_comm title "communication, waiting", \
         f using (other(0) ? x0(($2 + $3) / 2) : NaN):1:(($3 - $2) / 2000.0):(0.38) with boxxyerror lc rgb c_other title "other compute", \
         f using (is("compute", "forward") ? x0(($2 + $3) / 2) : NaN):1:(($3 - $2) / 2000.0):(0.38) with boxxyerror lc rgb c_fwd title "forward Fi (micro-batch i)", \
         f using (is("compute", "backward") ? x0(($2 + $3) / 2) : NaN):1:(($3 - $2) / 2000.0):(0.38) with boxxyerror lc rgb c_bwd title "backward Bi (input half where split)", \
         f using (is("compute", "backward_weight") ? x0(($2 + $3) / 2) : NaN):1:(($3 - $2) / 2000.0):(0.38) with boxxyerror lc rgb c_wgt title "weight half Wi", \
         keyentry with boxes fc rgb c_idle title "idle", \
         f using (fb(0) ? x0(($2 + $3) / 2) : NaN):1:(($3 - $2) / 1000.0 > span * 0.013 ? sprintf("%s%d", letter(0), column(6)) : "") with labels tc rgb "#ffffff" font ",9" notitle
}
unset multiplot
