# Chart 8: plan3d's layouts of one model on a cluster: the predicted step time by
# part (top) and memory per GPU by category (bottom), the winner marked.
#
# Reads plan.tsv, written by make_charts.py's plan_table from plan3d --json:
#   python3 -c "import sys; sys.path.insert(0, 'plots'); import make_charts; make_charts.plan_table('build', 'plan.tsv')"
#   gnuplot -e "src='plan.tsv'; out='plan'; fmt='png'" plots/plan.gp
# Variables (all optional): src [plan.tsv], out [plan], fmt [png] (png or svg).
if (!exists("src")) src = "plan.tsv"
if (!exists("out")) out = "plan"
if (!exists("fmt")) fmt = "png"
meta(k) = system(sprintf("sed -n 's/^# %s: //p' '%s' | head -n 1", k, src))
if (fmt eq "svg") {
    set terminal svg size 1300,900 dynamic font "DejaVu Sans,13" background "#ffffff"
} else {
    set terminal pngcairo size 1300,900 font "DejaVu Sans,11"
}
set output out.".".fmt
set datafile separator "\t"
set datafile columnheaders
set termoption noenhanced

limit = meta("limit_gib") + 0
mem = meta("mem_gib") + 0
stats src using "tp" nooutput
n = STATS_records
set multiplot layout 2,1 title "plan3d: predicted step time and memory per GPU, the best layout of each TP x PP\n".meta("subtitle") font ",13"
set style data histograms
set style histogram rowstacked
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.7
set xrange [-0.6 : n - 0.4]
set grid y
set key outside right top Left reverse samplen 2 spacing 1.2
set linetype 11 lc rgb "#4c72b0"
set linetype 12 lc rgb "#c44e52"
set linetype 13 lc rgb "#55a868"
set linetype 14 lc rgb "#c8c8c8"
set linetype 15 lc rgb "#dd8452"
set linetype 16 lc rgb "#8c8c8c"
set lmargin 10
set rmargin 26

# top: seconds per step by part; no bar where the layout does not fit
set ylabel "step time, s (predicted)"
set yrange [0 : *]
set offsets 0, 0, graph 0.12, 0
set format x ""
parts = "compute_s tp_s pp_s bubble_s dp_s optimizer_s"
pnames = "'compute' 'TP traffic' 'PP traffic' 'bubble' 'DP traffic (exposed)' 'optimizer'"
fits(c) = column("fits") > 0 ? column(c) : 0
plot for [i = 1 : 6] src using (fits(word(parts, i))):xtic("") lt i + 10 title word(pnames, i), \
     src using 0:(column("fits") > 0 ? column("step_s") : 1/0):(column("winner") > 0 ? sprintf("winner\n%.0f", column("step_s")) : sprintf("%.0f", column("step_s"))) \
         with labels offset 0, 0.8 font ",10" notitle, \
     src using 0:(column("fits") > 0 ? 1/0 : 0):("does not fit") with labels rotate left offset 0, 0.5 font ",10" notitle

# bottom: memory per GPU by category, the usable memory as a line
set ylabel "GiB per GPU (the fullest stage)"
set yrange [0 : *]
set format x "%g"
set xtics rotate by -30 nomirror
cats = "params_gib grads_gib optim_gib acts_gib comm_gib workspace_gib"
cnames = "'parameters' 'gradients' 'optimizer state' 'activations' 'comm buffers' 'workspace'"
set arrow 1 from graph 0, first limit to graph 1, first limit nohead lw 2 dt 2 lc rgb "#000000" front
set label 1 sprintf("usable %.0f GiB of %.0f", limit, mem) at graph 1, first limit offset 1, 0 left font ",10"
plot for [i = 1 : 6] src using (column(word(cats, i))):xtic(sprintf("%s%s", strcol("layout"), column("winner") > 0 ? " *" : "")) lt i + 10 title word(cnames, i), \
     src using 0:"total_gib":(sprintf("%.0f", column("total_gib"))) with labels offset 0, 0.7 font ",10" notitle
unset multiplot
