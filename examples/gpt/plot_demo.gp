# examples/gpt/plot_demo.gp — zero-demo's picture from its CSV. zero-demo runs it when gnuplot is installed:
#   gnuplot -e "csv='demo-out/zero-demo.csv'; png='demo-out/zero-demo.png'" examples/gpt/plot_demo.gp
# Top: memory per rank by category, stacked, for each run the measured bar and beside it (lighter) the bar
# zero::Estimate predicted before the run; the dots are the device tier's true peak (all tags alive at once),
# measured and the estimate's bound on it. Bottom: tokens per second.
if (!exists("csv")) csv = 'demo-out/zero-demo.csv'
if (!exists("png")) png = 'demo-out/zero-demo.png'
if (!exists("title")) title = 'zero-demo'

set datafile separator ','
set terminal pngcairo size 1500,1000 font 'sans,11' noenhanced
set output png

# Columns: 1 run, 2 model, 3 world, 4 stage, 5 dtype, 6 recompute, 7 offload, 8-15 the measured categories,
# 16-23 the estimated ones, 24 model_state, 25 est_model_state, 26 formula, 27 peak_device, 28 peak_host,
# 29 est_peak_device, 30 est_peak_host, 31 loss_first, 32 loss_last, 33 step_ms, 34 tokens_per_s.
cats = 'params grads optimizer master gather buckets activations staging'
MiB = 1048576.0
measured(k) = sum [j=8:7+k] column(j)
estimated(k) = sum [j=16:15+k] column(j)

set multiplot layout 2,1 title title font 'sans,14'
set lmargin 12
set rmargin 34
set grid ytics
set xrange [-1:*]
set boxwidth 0.9
set key outside right top
set xtics nomirror scale 0
set ylabel 'MiB per rank'
set title "memory per rank by category (each at its peak, both tiers): measured | estimate (lighter)"
# Drawn tallest first, so each shorter stack covers the one above it: the bands are the categories.
plot for [k=8:1:-1] csv skip 1 using (3*$0):(measured(k)/MiB) with boxes fs solid 0.85 lc k title word(cats, k), \
     for [k=8:1:-1] csv skip 1 using (3*$0+1):(estimated(k)/MiB) with boxes fs solid 0.35 lc k notitle, \
     csv skip 1 using (3*$0+0.5):(0):xticlabels(1) with points ps 0 notitle, \
     csv skip 1 using (3*$0):($27/MiB) with points pt 7 ps 1.6 lc rgb 'black' title 'true peak, device (measured)', \
     csv skip 1 using (3*$0+1):($29/MiB) with points pt 6 ps 1.6 lc rgb 'black' title 'its bound (estimate)'

set title 'tokens per second (all ranks, after the first step)'
set ylabel 'tokens / s'
set yrange [0:*]
plot csv skip 1 using (3*$0+0.5):34:xticlabels(1) with boxes fs solid 0.6 lc rgb '#4477aa' notitle
unset multiplot
