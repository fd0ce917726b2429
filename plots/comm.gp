# Chart 6: the bytes a rank sends per step (ring traffic; point to point: what it sends) by every
# lab and layout, coloured by the link the technique needs, labelled with the calls per step
# (the tests hold every bar to the lab's formula).
#
# Reads comm.tsv, written by records_to_tsv.py from any records.jsonl:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='comm.tsv'; out='comm'; fmt='png'" ../plots/comm.gp
# Variables (all optional): src [comm.tsv], out [comm], fmt [png] (png or svg).
if (!exists("src")) src = "comm.tsv"
if (!exists("out")) out = "comm"
if (!exists("fmt")) fmt = "png"
meta(k) = system(sprintf("sed -n 's/^# %s: //p' '%s' | head -n 1", k, src))
if (fmt eq "svg") {
    set terminal svg size 1300,700 dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1300,700 font "DejaVu Sans,11"
}
set output out.".".fmt
set datafile separator "\t"
set datafile columnheaders
set termoption noenhanced

set linetype 1 lc rgb "#4c72b0"
set linetype 2 lc rgb "#dd8452"
set linetype 3 lc rgb "#55a868"
set linetype 4 lc rgb "#c44e52"
set linetype 5 lc rgb "#8172b3"
set linetype 6 lc rgb "#937860"
stats src using 4 nooutput
nrun = STATS_records

set title "Bytes a rank sends per step, and the link each technique needs\n".meta("subtitle") font ",13"
set ylabel "bytes a rank sends per step (MB, log scale)"
set xlabel "lab and layout (label: calls per step, each a wait; every bar equals the lab's formula, tested)"
set logscale y
set format y "%g"
set yrange [* : *]
set offsets 0, 0, graph 0.45, 0
set xrange [-0.6 : nrun - 0.4]
set xtics rotate by 35 right nomirror
set grid y
set key inside left top Left reverse samplen 2 spacing 1.2 width 2 opaque box
set style fill solid 0.85 border rgb "#333333"
set boxwidth 0.6
colour(k) = k == 1 ? 0x4c72b0 : k == 2 ? 0x55a868 : k == 3 ? 0xc44e52 : k == 4 ? 0x8172b3 : 0xdd8452
plot src using 0:($9 / 1e6):(colour($8)):xtic(1) with boxes lc rgb variable notitle, \
     keyentry with boxes lc rgb "#4c72b0" title "DP, ZeRO: any link (once a step, overlaps the backward)", \
     keyentry with boxes lc rgb "#55a868" title "pipelines: the network between hosts is enough", \
     keyentry with boxes lc rgb "#c44e52" title "TP: the fastest, inside a host (blocks every layer)", \
     keyentry with boxes lc rgb "#8172b3" title "3D: each group on its own link", \
     keyentry with boxes lc rgb "#dd8452" title "CP, EP: fast (inside every layer; CP's ring overlaps attention)", \
     src using 0:($9 / 1e6):(sprintf("%d calls", $7)) with labels offset 0, 0.9 font ",10" notitle
