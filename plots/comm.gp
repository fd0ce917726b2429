# Chart 6: bytes communicated per rank per step by every lab and layout,
# measured (ring traffic, from the calls the lab made) against the lab's formula.
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

set title "Bytes communicated per rank per step: measured against the formula\n".meta("subtitle") font ",13"
set ylabel "ring traffic per rank per step (MB, log scale)"
set xlabel "lab and layout (label: measured / formula)"
set logscale y
set format y "%g"
set yrange [* : *]
set offsets 0, 0, graph 0.12, 0
set xrange [-0.6 : nrun - 0.4]
set xtics rotate by 35 right nomirror
set grid y
set key outside right top Left reverse samplen 2 spacing 1.3
set style fill solid 0.85 border rgb "#333333"
set boxwidth 0.36
# measured: a bar in the lab's colour; formula: a hatched bar beside it
plot src using ($0 - 0.19):($4 / 1e6):(0.36):2:xtic(1) with boxes lc variable title "measured (colour of the lab)", \
     src using ($0 + 0.19):($5 / 1e6):(0.36) with boxes fs pattern 4 border rgb "#333333" lc rgb "#333333" title "formula", \
     src using 0:(($4 > $5 ? $4 : $5) / 1e6):($5 > 0 ? sprintf("%.3f", $4 / $5) : "") with labels offset 0, 0.9 font ",10" notitle
