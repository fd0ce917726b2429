# Chart 5: the loss curve of every lab and layout over the one-rank baseline
# (top), and each run's relative difference from it (bottom).
#
# Reads loss.tsv (step, then one column per run, the baseline first), written by
# records_to_tsv.py from any records.jsonl:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='loss.tsv'; out='loss'; fmt='png'" ../plots/loss.gp
# Variables (all optional): src [loss.tsv], out [loss], fmt [png] (png or svg),
# tol [1e-5] (the bound the tests hold every lab to), heading [the title's words].
if (!exists("src")) src = "loss.tsv"
if (!exists("out")) out = "loss"
if (!exists("fmt")) fmt = "png"
if (!exists("tol")) tol = 1e-5
tol = tol + 0                # a number, also when given as a string (make_charts.py quotes its variables)
if (!exists("heading")) heading = "Loss of every lab and layout over the one-rank baseline"
meta(k) = system(sprintf("sed -n 's/^# %s: //p' '%s' | head -n 1", k, src))
if (fmt eq "svg") {
    set terminal svg size 1300,820 dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1300,820 font "DejaVu Sans,11"
}
set output out.".".fmt
set datafile separator "\t"
set datafile columnheaders
set termoption noenhanced

n = meta("series") + 0       # runs: columns 2 .. n+1, the baseline in column 2
labs = meta("labs")          # each run's lab number: its colour, as in the other charts
set linetype 1 lc rgb "#4c72b0"
set linetype 2 lc rgb "#dd8452"
set linetype 3 lc rgb "#55a868"
set linetype 4 lc rgb "#c44e52"
set linetype 5 lc rgb "#8172b3"
set linetype 6 lc rgb "#937860"
lab(i) = words(labs) >= i - 1 ? word(labs, i - 1) + 0 : i
floor = 1e-10                # an exact match is drawn here on the log axis
stats src using 1 nooutput
steps = STATS_max

set multiplot title heading." (".meta("baseline").")\n".meta("subtitle") font ",13"
set lmargin at screen 0.08
set rmargin at screen 0.74
set xrange [0.5 : steps + 0.5]
set xtics 1
if (steps > 20) { set xtics autofreq }
set grid

set tmargin at screen 0.88
set bmargin at screen 0.52
set ylabel "training loss (nats per token)"
set xlabel ""
set format x ""
set key at screen 0.755, 0.88 left top Left reverse samplen 2 spacing 1.05 font ",10" title "run (lab, layout)"
plot src using 1:2 with lines lw 6 lc rgb "#bbbbbb" title columnhead(2), \
     for [i = 3 : n + 1] src using 1:i with linespoints lw 1 pt (i % 13) + 1 ps 1.1 lt lab(i) title columnhead(i)

set tmargin at screen 0.46
set bmargin at screen 0.09
set format x "%g"
set xlabel "step"
set ylabel "|loss - baseline| / baseline"
set logscale y
set yrange [floor / 3 : *]
set format y "1e%L"
unset key
set label 1 sprintf("test bound %g", tol) at graph 0.02, first tol * 1.8 left
set label 2 sprintf("exact match (drawn at %g)", floor) at graph 0.02, first floor * 1.8 left
plot for [i = 3 : n + 1] src using 1:(d = abs(column(i) - $2) / $2, d > floor ? d : floor) with linespoints lw 1 pt (i % 13) + 1 ps 1.1 lt lab(i) notitle, \
     tol with lines lw 2 dt 2 lc rgb "#000000" notitle
unset multiplot
