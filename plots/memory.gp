# Chart 3a: peak memory per rank by category (stacked), data parallel against
# ZeRO stages 1, 2 and 3, with the formula of the model states marked.
#
# Reads memory.tsv, written by records_to_tsv.py from any records.jsonl:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='memory.tsv'; out='memory'; fmt='png'" ../plots/memory.gp
# Variables (all optional): src [memory.tsv], out [memory], fmt [png] (png or svg).
if (!exists("src")) src = "memory.tsv"
if (!exists("out")) out = "memory"
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

set title "Peak memory per rank by category: data parallel against ZeRO-1/2/3\n".meta("subtitle") font ",13"
set ylabel "peak bytes on rank 0 (MB = 10^6 bytes)"
set xlabel "run, and its formula of the model states per rank (Ψ parameters, N ranks)" offset 0, -0.6
set bmargin 6
set style data histograms
set style histogram rowstacked
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.6
stats src using 3 nooutput
set xrange [-0.6 : STATS_records - 0.4]
set yrange [0 : *]
set offsets 0, 0, graph 0.08, 0
set grid y
set key outside right top Left reverse samplen 2 spacing 1.3
set linetype 11 lc rgb "#4c72b0"
set linetype 12 lc rgb "#55a868"
set linetype 13 lc rgb "#dd8452"
set linetype 14 lc rgb "#c8c8c8"
set linetype 15 lc rgb "#c44e52"
set linetype 16 lc rgb "#8c8c8c"
names = "'parameters' 'gradients' 'AdamW moments' 'activations' 'comm buffers' 'workspace'"
# the model states (the three ZeRO shards) at the bottom, what ZeRO leaves alone on top
plot for [c = 3 : 8] src using (column(c) / 1e6):xtic(sprintf("%s\n%s", strcol(1), strcol("formula"))) lt c + 8 title word(names, c - 2), \
     src using ($0 - 0.42):(column("formula_states") / 1e6):(0.84):(0) with vectors nohead lw 3 lc rgb "#000000" title "formula of the model states", \
     src using 0:(column("total") / 1e6):(sprintf("%.1f MB", column("total") / 1e6)) with labels offset 0, 0.8 notitle
