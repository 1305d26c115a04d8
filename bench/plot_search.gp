# plot_search.gp: recall@10 against queries/s from bench/bench_search's or
# bench/bench_search_gpu's --dat file: the adaptive search (one point per recall target) and
# PLAID's fixed stages (one curve per ncells and threshold, one point per ndocs), ColBERT's
# old default (ncells 1, threshold 0.5, ndocs 256) among them.
#
#   gnuplot -e "datafile='x.dat'; outfile='x.png'; title='...'; xlab='queries/s ...'" \
#       bench/plot_search.gp
#
# The data file holds one block (two blank lines apart) per curve, with the columns
# recall_at_10 queries_per_s p50_ms target ncells threshold ndocs; the first block is the
# adaptive search.
if (!exists("datafile")) datafile = 'bench/bench_search.dat'
if (!exists("outfile")) outfile = 'bench/search_recall_qps.png'
if (!exists("title")) title = 'tartan search: recall@10 against exhaustive vs queries/s'
if (!exists("xlab")) xlab = 'queries/s (log scale)'

stats datafile using 1 nooutput
nb = STATS_blocks
names = "adaptive"
do for [i = 1:nb - 1] {
    stats datafile index i using 5:6 nooutput
    names = names . sprintf(" fixed:ncells=%d,threshold=%.2f", STATS_min_x, STATS_min_y)
}

set terminal pngcairo size 1000,650 font ",11" noenhanced
set output outfile
set title title
set xlabel xlab
set ylabel "recall@10 against exhaustive search"
set logscale x
set grid
set key bottom left
set yrange [*:1.005]
set arrow from graph 0, first 0.95 to graph 1, first 0.95 nohead dashtype 2 lc rgb "gray40"
plot datafile index 0 using 2:1 smooth unique with linespoints lw 3 pt 7 ps 1.5 lc rgb "#d62728" \
         title "adaptive (points: recall targets)", \
     datafile index 0 using 2:1:(sprintf("%.2f", $4)) with labels offset 2.5,-0.8 notitle, \
     for [i = 1:nb - 1] datafile index i using 2:1 with linespoints lw 1.5 pt 6 \
         title word(names, i + 1), \
     datafile every ::0::0 index 1:nb-1 using 2:($7 == 256 && $5 == 1 && $6 > 0.49 ? $1 : 1/0) \
         with points pt 5 ps 2 lc rgb "black" title "ColBERT's fixed default (1, 0.5, 256)"
