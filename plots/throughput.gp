# Chart 4: throughput (tokens per second) of every lab and layout at the same
# model and global batch, beside the one-rank baseline.
#
# Reads throughput.tsv, written by records_to_tsv.py from any records.jsonl:
#   python3 plots/records_to_tsv.py runs/records.jsonl --out mycharts
#   cd mycharts && gnuplot -e "src='throughput.tsv'; out='throughput'; fmt='png'" ../plots/throughput.gp
# Variables (all optional): src [throughput.tsv], out [throughput], fmt [png] (png or svg).
if (!exists("src")) src = "throughput.tsv"
if (!exists("out")) out = "throughput"
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

# one colour per lab, the same in the loss and communication charts
set linetype 1 lc rgb "#4c72b0"
set linetype 2 lc rgb "#dd8452"
set linetype 3 lc rgb "#55a868"
set linetype 4 lc rgb "#c44e52"
set linetype 5 lc rgb "#8172b3"
set linetype 6 lc rgb "#937860"
labs = "'lab01 data parallel' 'lab02 ZeRO' 'lab03 naive pipeline' 'lab04 GPipe / 1F1B' 'lab05 tensor parallel' 'lab06 3D'"
base = meta("baseline") + 0
stats src using 2 nooutput
nrun = STATS_records
lab_lo = int(STATS_min)
lab_hi = int(STATS_max)

set title "Throughput of every lab and layout at the same model and global batch\n".meta("subtitle") font ",13"
set ylabel "throughput (tokens/s, median step after the first)"
set xlabel "lab and layout (dp = data-parallel ranks, pp = stages, m = micro-batches, tp = tensor-parallel ranks)"
set xrange [-0.6 : nrun - 0.4]
set yrange [0 : *]
set offsets 0, 0, graph 0.08, 0
set xtics rotate by 35 right nomirror
set grid y
set boxwidth 0.7
set style fill solid 0.85 border rgb "#333333"
set key outside right top Left reverse samplen 2 spacing 1.3
set style textbox opaque noborder margins 1, 1
plot src using 0:4:2:xtic(1) with boxes lc variable notitle, \
     for [l = lab_lo : lab_hi] keyentry with boxes lt l title word(labs, l), \
     base lw 2 dt 2 lc rgb "#000000" title "lab01 -n 1 (the baseline)", \
     src using 0:4:(sprintf("%.1fk", $4 / 1000)) with labels boxed offset 0, 0.8 font ",10" notitle
