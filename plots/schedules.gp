# The ideal timeline of each pipeline schedule (Gantt, unit times), one panel per
# schedule, drawn from lab04's own lists (--print-schedule) by schedule_gantt.py:
#   (for s in gpipe 1f1b interleaved zb-h1 zb-v; do mpirun -n 4 ./lab04_1f1b --print-schedule --micro-batches 8 --schedule $s; done) \
#       | python3 ../plots/schedule_gantt.py > schedules.tsv
#   gnuplot -e "src='schedules.tsv'" ../plots/schedules.gp
# Variables (all optional): src [schedules.tsv], out [schedules], fmt [png] (png or svg).
# Columns: schedule rank start end op micro_batch chunk. F blue, B green, W orange; grey: idle.
if (!exists("src")) src = "schedules.tsv"
if (!exists("out")) out = "schedules"
if (!exists("fmt")) fmt = "png"
names = system(sprintf("awk -F'\t' 'NR > 1 && !seen[$1]++ { printf \"%%s \", $1 }' '%s'", src))
n = words(names)
if (fmt eq "svg") {
    set terminal svg size 1400, 160 + 200 * n dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1400, 160 + 200 * n font "DejaVu Sans,11"
}
set output out.".".fmt
set datafile separator "\t"
set datafile columnheaders
set termoption noenhanced
c_fwd = "#4c72b0"; c_bwd = "#55a868"; c_wgt = "#dd8452"; c_idle = "#e6e6e6"

# the longest makespan sets the common axis; each schedule's own ranks and makespan
array MS[n]; array R[n]; array WK[n]
span = 0
do for [i = 1 : n] {
    s = word(names, i)
    stats src using (strcol(1) eq s ? $4 : NaN) nooutput
    MS[i] = STATS_max
    stats src using (strcol(1) eq s ? $2 : NaN) nooutput
    R[i] = int(STATS_max) + 1
    stats src using (strcol(1) eq s && $2 == 0 ? $4 - $3 : NaN) nooutput
    WK[i] = STATS_sum
    span = MS[i] > span ? MS[i] : span
}
set multiplot title "Pipeline schedules at unit times (forward 1, backward 2 or input half 1 + weight half 1, sends free)\nfrom lab04_1f1b --print-schedule: what each rank runs when nothing but the schedule makes it wait" font ",13"
h = 0.82 / n
set xrange [0 : span * 1.01]
set ylabel "rank"
set ytics 1 nomirror
set grid x
set style fill solid 1.0 border rgb "#ffffff"
set lmargin at screen 0.06
set rmargin at screen 0.97
do for [i = 1 : n] {
    s = word(names, i)
    set tmargin at screen 0.88 - (i - 1) * h - 0.04
    set bmargin at screen 0.88 - i * h + 0.04
    set yrange [R[i] - 0.5 : -0.5]
    set xlabel (i == n ? "time (units of one stage's forward)" : "")
    unset object
    do for [r = 0 : R[i] - 1] {
        set object r + 1 rect from 0, r - 0.38 to MS[i], r + 0.38 fc rgb c_idle fs solid 1.0 noborder behind
    }
    work = WK[i]
    set title sprintf("%s: makespan %g units, work %g per rank, idle %.3f of the step (%.3f of the ideal)", s, MS[i], work, 1 - work / MS[i], MS[i] / work - 1)
    if (i == 1) { set key at screen 0.06, 0.89 left bottom Left reverse horizontal width 2 samplen 2 } else { unset key }
    is(o) = strcol(1) eq s && strcol(5) eq o
    lbl(o) = ($4 - $3) >= 0.9 ? sprintf("%s%d%s", o, column(6), column(7) > 0 || strcol(1) eq "interleaved" || strcol(1) eq "zb-v" ? sprintf(".%d", column(7)) : "") : ""
    plot src using (is("F") ? ($3 + $4) / 2 : NaN):2:(($4 - $3) / 2):(0.38) with boxxyerror lc rgb c_fwd title "forward Fi (.c: chunk c)", \
         src using (is("B") ? ($3 + $4) / 2 : NaN):2:(($4 - $3) / 2):(0.38) with boxxyerror lc rgb c_bwd title "backward Bi (input half where split)", \
         src using (is("W") ? ($3 + $4) / 2 : NaN):2:(($4 - $3) / 2):(0.38) with boxxyerror lc rgb c_wgt title "weight half Wi", \
         keyentry with boxes fc rgb c_idle title "idle", \
         src using (strcol(1) eq s ? ($3 + $4) / 2 : NaN):2:(lbl(strcol(5))) with labels tc rgb "#ffffff" font ",8" notitle
}
unset multiplot
