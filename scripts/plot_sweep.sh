#!/usr/bin/env bash
# plot_sweep.sh: the plots of an L1 sweep (scripts/sweep_l1.sh), as PNG with gnuplot:
#   DIR/val_ce_vs_l0.png   final val CE against mean L0 as % of H (log scale), one labelled
#                          point per lambda; dashed lines mark the target (2% of H, +3% CE)
#   DIR/l0_per_layer.png   mean L0 per layer (log scale), one line per lambda
#   DIR/loss_curves.png    training CE against step per lambda (a moving average over 1/25 of
#                          the run), the whole run and its second half
#   DIR/acc_vs_l0.png      the last multiple-choice evaluation's acc_norm (and acc) against mean
#                          L0 as % of H, one labelled point per lambda (runs with --eval-file only)
# It reads DIR/results.csv (scripts/sweep_results.sh writes it) and DIR/lambda_*/log.jsonl.
#
# usage: scripts/plot_sweep.sh DIR
# needs gnuplot: apt-get install gnuplot-nox
set -euo pipefail

die() { echo "error: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: scripts/plot_sweep.sh DIR"
case "$1" in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
dir=$1
command -v gnuplot > /dev/null 2>&1 || die "gnuplot is not installed: apt-get install gnuplot-nox"
[ -f "$dir/results.csv" ] || die "$dir/results.csv not found: run scripts/sweep_results.sh $dir first"
if gnuplot -e 'set terminal pngcairo' > /dev/null 2>&1; then
    term='pngcairo enhanced font "DejaVu Sans,11"'
else
    term='png'
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# results.csv as whitespace-separated columns (runs without a numeric L0 are left out):
# lambda l0_pct_h val_ce; lambda l0_pct_h acc_norm acc; and per layer one block "layer l0_mean" per lambda
: > "$tmp/acc.dat"
awk -F, -v pts="$tmp/points.dat" -v accs="$tmp/acc.dat" -v layers="$tmp/layers.dat" -v names="$tmp/names.txt" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
        L = $col["layers"] + 0
        if ($col["l0_pct_h"] ~ /^[0-9.eE+-]+$/ && $col["val_ce"] ~ /^[0-9.eE+-]+$/) print $1, $col["l0_pct_h"], $col["val_ce"] > pts
        if ($col["l0_pct_h"] ~ /^[0-9.eE+-]+$/ && $col["acc_norm"] ~ /^[0-9]/) print $1, $col["l0_pct_h"], $col["acc_norm"], $col["acc"] > accs
        if (L == 0) next
        if (blocks++) printf "\n\n" > layers
        for (l = 0; l < L; l++) print l, $col["l0_mean_layer" l] > layers
        printf "%s ", $1 > names
        if ($1 + 0 == 0) ref = $col["val_ce"]
        if (H == "") H = $col["hidden"]
    }
    END { printf "\n" > names; print (ref == "" ? "NaN" : ref), (H ~ /^[0-9]+$/ ? H : "NaN") > (names ".ref") }
' "$dir/results.csv"
[ -s "$tmp/points.dat" ] || die "$dir/results.csv has no run with a val CE and an L0"
read -r ref hidden < "$tmp/names.txt.ref"
names=$(cat "$tmp/names.txt" 2> /dev/null || true)

# the training CE of each lambda in the order of results.csv, a moving average over 1/25 of the run
n_curves=0
: > "$tmp/curves.dat"
curve_names=""
for v in $(awk -F, 'NR > 1 {print $1}' "$dir/results.csv"); do
    log="$dir/lambda_$v/log.jsonl"
    [ -f "$log" ] || continue
    if [ $n_curves -gt 0 ]; then printf '\n\n' >> "$tmp/curves.dat"; fi
    sed -n 's/^{"type":"train","step":\([0-9]*\),.*"ce":\([-0-9.e+]*\),.*/\1 \2/p' "$log" |
        awk '{s[NR] = $1; c[NR] = $2}
             END {w = int(NR / 25); if (w < 1) w = 1
                  for (i = 1; i <= NR; i++) {sum += c[i]; if (i > w) sum -= c[i - w]; print s[i], sum / (i < w ? i : w)}}' >> "$tmp/curves.dat"
    n_curves=$((n_curves + 1))
    curve_names="$curve_names $v"
done
max_step=$(awk 'NF == 2 && $1 > m {m = $1} END {print m + 0}' "$tmp/curves.dat")
n_layer_blocks=$(echo "$names" | wc -w)
# the first plot's ranges take in the target lines: 2% of H, and 3% over lambda = 0's val CE
read -r xmin xmax ymin ymax < <(awk -v ref="$ref" '
    {x = $2 + 0; y = $3 + 0; if (NR == 1 || x < x0) x0 = x; if (NR == 1 || x > x1) x1 = x
     if (NR == 1 || y < y0) y0 = y; if (NR == 1 || y > y1) y1 = y}
    END {if (x0 > 2) x0 = 2; if (x1 < 2) x1 = 2
         if (ref != "NaN") {if (ref * 1.03 > y1) y1 = ref * 1.03; if (ref * 1.03 < y0) y0 = ref * 1.03}
         if (x0 <= 0) x0 = 0.01; pad = (y1 - y0) * 0.08; if (pad == 0) pad = 0.01
         print x0 / 1.6, x1 * 1.6, y0 - pad, y1 + pad}' "$tmp/points.dat")

gnuplot <<EOF
set terminal $term size 900,600
set datafile missing "NaN"
set grid lc rgb "#dddddd"
set key outside right top title "lambda"

set output "$dir/val_ce_vs_l0.png"
set title "Final val CE against FFN sparsity, one point per lambda"
set xlabel "mean L0: firing FFN units per token, % of H (log scale)"
set ylabel "val CE (nats)"
set logscale x
set xrange [$xmin:$xmax]
set yrange [$ymin:$ymax]
set key off
if ("$ref" ne "NaN") { set arrow 1 from graph 0, first ($ref * 1.03) to graph 1, first ($ref * 1.03) nohead dt 2 lc rgb "#cc3333"
    set label 1 "val CE of lambda = 0, +3%" at graph 0.98, first ($ref * 1.03) right offset 0, 0.7 tc rgb "#cc3333" }
set arrow 2 from first 2, graph 0 to first 2, graph 1 nohead dt 2 lc rgb "#3366cc"
set label 2 "L0 = 2% of H" at first 2, graph 0.04 offset 0.5, 0 tc rgb "#3366cc"
set xtics ("0.1" 0.1, "0.2" 0.2, "0.5" 0.5, "1" 1, "2" 2, "5" 5, "10" 10, "20" 20, "50" 50, "100" 100)
set format y "%.2f"
plot "$tmp/points.dat" using 2:3 with linespoints pt 7 ps 1.3 lw 1.5 lc rgb "#444444" notitle, \
     "" using 2:3:(sprintf("%s", stringcolumn(1))) with labels offset 1.2, 0.8 left font ",10" notitle
unset arrow; unset label; unset logscale x; set autoscale; set xtics autofreq; set format y "% h"

set output "$dir/l0_per_layer.png"
set title "Mean L0 per layer (firing FFN units per token) at the end of training"
set xlabel "layer"
set ylabel "mean L0 (log scale)"
set logscale y
set xtics 1
set key outside right top title "lambda"
if ("$hidden" ne "NaN") { set arrow 1 from graph 0, first (0.02 * $hidden) to graph 1, first (0.02 * $hidden) nohead dt 2 lc rgb "#3366cc"
    set label 1 "2% of H" at graph 0.01, first (0.02 * $hidden) offset 0, 0.7 tc rgb "#3366cc" }
names = "$names"
plot for [i = 1:$n_layer_blocks] "$tmp/layers.dat" index (i - 1) using 1:2 with linespoints pt 7 lw 2 lc i title word(names, i)
unset arrow; unset label; unset logscale y; set xtics autofreq

set terminal $term size 1200,500
set output "$dir/loss_curves.png"
set multiplot layout 1, 2 title "Training CE (moving average over 1/25 of the run)"
curves = "$curve_names"
set xlabel "step"
set ylabel "train CE (nats)"
set key inside right top title "lambda"
set title "whole run"
plot for [i = 1:$n_curves] "$tmp/curves.dat" index (i - 1) using 1:2 with lines lw 2 lc i title word(curves, i)
set title "second half"
set xrange [$max_step / 2:$max_step]
set autoscale y
stats "$tmp/curves.dat" using (\$1 >= $max_step / 2 ? \$2 : NaN) nooutput
set yrange [STATS_min - 0.05 * (STATS_max - STATS_min):STATS_max + 0.05 * (STATS_max - STATS_min) + 1e-6]
plot for [i = 1:$n_curves] "$tmp/curves.dat" index (i - 1) using 1:2 with lines lw 2 lc i title word(curves, i)
unset multiplot
EOF
plots="$dir/val_ce_vs_l0.png, $dir/l0_per_layer.png, $dir/loss_curves.png"
if [ -s "$tmp/acc.dat" ]; then
    gnuplot <<EOF
set terminal $term size 900,600
set grid lc rgb "#dddddd"
set output "$dir/acc_vs_l0.png"
set title "Multiple-choice accuracy (the last evaluation) against FFN sparsity, one point per lambda"
set xlabel "mean L0: firing FFN units per token, % of H (log scale)"
set ylabel "accuracy"
set logscale x
set xrange [$xmin:$xmax]
set xtics ("0.1" 0.1, "0.2" 0.2, "0.5" 0.5, "1" 1, "2" 2, "5" 5, "10" 10, "20" 20, "50" 50, "100" 100)
set format y "%.3f"
set key outside right top
plot "$tmp/acc.dat" using 2:3 with linespoints pt 7 ps 1.3 lw 1.5 lc rgb "#444444" title "acc_norm" noenhanced, \
     "" using 2:4 with linespoints pt 6 ps 1.1 lw 1 dt 2 lc rgb "#888888" title "acc", \
     "" using 2:3:(sprintf("%s", stringcolumn(1))) with labels offset 1.2, 0.8 left font ",10" notitle
EOF
    plots="$plots, $dir/acc_vs_l0.png"
fi
echo "plots: $plots"
