# plot_search.gp: recall@10 against single-query latency from bench/bench_search's --dat
# file, one curve per ncells (and threshold), one point per ndocs, the k = 10 defaults marked.
#
#   gnuplot -e "datafile='bench/bench_search.dat'; outfile='bench/search_recall_latency.png'" \
#       bench/plot_search.gp
#
# The data file holds one block (two blank lines apart) per curve, with the columns
# ncells threshold ndocs recall_at_10 p50_ms p99_ms mean_ms, then a last block of the
# defaults: k ncells threshold ndocs recall p50_ms (first line k = 10).
if (!exists("datafile")) datafile = 'bench/bench_search.dat'
if (!exists("outfile")) outfile = 'bench/search_recall_latency.png'

stats datafile using 1 nooutput
nb = STATS_blocks
# Curve names from each block's own ncells and threshold (no spaces: word() splits on them).
# Colour by ncells, dash by threshold: each threshold's curves form one family.
names = ""
array colour[nb]
array dash[nb]
family = 0
last_threshold = -1e30
do for [i = 0:nb - 2] {
    stats datafile index i using 1:2 nooutput
    names = names . sprintf("ncells=%d,threshold=%.2f ", STATS_min_x, STATS_min_y)
    if (STATS_min_y != last_threshold) { family = family + 1; last_threshold = STATS_min_y }
    colour[i + 1] = 1 + int(log(STATS_min_x) / log(2) + 0.5)
    dash[i + 1] = family
}

set terminal pngcairo size 1000,650 font ",11" noenhanced
set output outfile
set title "tartan search on the CPU: recall@10 against exhaustive search vs latency\n(one query a call, one thread; labels: ndocs)"
set xlabel "single-query latency, median (ms, log scale)"
set ylabel "recall@10 against exhaustive"
set logscale x
set grid
set key bottom right
# At least 0.94 to 1, so that the 0.95 and 0.99 lines show even when every point is near 1.
ylo = 0.94
do for [i = 0:nb - 2] {
    stats datafile index i using 4 nooutput
    if (STATS_min - 0.01 < ylo) { ylo = STATS_min - 0.01 }
}
if (exists("ymin")) ylo = ymin
set yrange [ylo:1.005]
set style data linespoints
set arrow 1 from graph 0, first 0.95 to graph 1, first 0.95 nohead dt 2 lc rgb "gray40"
set arrow 2 from graph 0, first 0.99 to graph 1, first 0.99 nohead dt 3 lc rgb "gray40"
set label 1 "0.95" at graph 0.01, first 0.95 offset 0, char 0.5 font ",9"
set label 2 "0.99" at graph 0.01, first 0.99 offset 0, char 0.5 font ",9"

plot for [i = 0:nb - 2] datafile index i using 5:4 lw 2 pt 7 ps 1.2 lc colour[i + 1] \
         dt dash[i + 1] title word(names, i + 1), \
     for [i = 0:nb - 2] datafile index i using 5:4:(sprintf("%d", $3)) with labels \
         offset char 0.6, char 0.6 font ",8" notitle, \
     datafile index (nb - 1) every ::0::0 using 6:5 with points pt 6 ps 3.5 lw 2 lc rgb "black" \
         title "defaults for k = 10"
