#!/usr/bin/env bash
# relufy_experiment.sh: sparsifying a pretrained dense model (ReLUfication) against sparse pretraining
# from scratch, on one GPU, on the embedded corpus. Three runs of train_gpt_sparse, one after the other:
#   (a) dense     a 124M-class dense SiLU model with an untied head (a Llama's FFN and head), from
#                 scratch, STEPS steps, lambda 0;
#   (b) relufied  (a)'s weights (--init-from, a fresh optimizer) with ReLU for SiLU, fine-tuned with the
#                 L1 term for STEPS / 4 steps (a quarter of (a)'s tokens), lambda ramped up over RAMP
#                 steps, at a fine-tune's learning rate (a short warmup, a lower peak), on another data order;
#   (c) scratch   a ReLU + L1 model of the same shape from scratch for STEPS + STEPS / 4 steps: the tokens
#                 of (a) and (b) together, at its own lambda (from scratch the same lambda kills more units:
#                 the default pair lands (b) and (c) at similar L0);
# then prints val CE and mean L0 of the three side by side (also DIR/results.md and DIR/results.csv) and
# plots val CE and L0 against the tokens each model has seen (DIR/relufy.png, with gnuplot).
# With the defaults (1600 + 400 + 2000 steps of 16 x 1024 tokens) the whole script takes about 3
# minutes on one H100 (the 124m shape trains 460K-560K tokens/s there).
#
# usage: dev/relufy_experiment.sh [flags]
#   -o, --out DIR         where the three runs go (default: out/relufy); each run's console output is
#                         DIR/<run>/train.log; runs already there are overwritten
#   --steps N             (a)'s steps (default 1600; (b) trains N / 4, (c) N + N / 4)
#   --lambda L            (b)'s L1 coefficient (default 1e-2)
#   --scratch-lambda L    (c)'s L1 coefficient (default 1e-3)
#   --ramp R              (b)'s steps over which lambda grows from 0 to L (default N / 32)
#   --lr LR               (a)'s and (c)'s peak learning rate (default 1e-3, warmup 100 steps)
#   --finetune-lr LR      (b)'s peak learning rate (default 6e-4, warmup N / 80 steps)
#   --dead-reinit 0|1     (b) and (c) with the dead-neuron re-initialisation (default 0)
#   --shape "FLAGS"       the model's shape flags for (a) and (c) (default "-e 124m")
#   --batch B             sequences per step (default 16)
#   --seq-len T           tokens per sequence (default 1024)
#   --device DEV          cuda (default) or cpu (only to try the script with a tiny --shape)
#   --no-plot             skip the plot (else gnuplot is required: apt-get install gnuplot-nox)
#   --report-only         train nothing: the table and the plot from the three runs already in DIR (for
#                         example on a machine with gnuplot, from runs copied off the GPU machine)
#   -h, --help            this text
# Run it from the repository root after make.
set -euo pipefail

die() { echo "error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

out=out/relufy
steps=1600
lambda=1e-2
scratch_lambda=1e-3
ramp=""
lr=1e-3
finetune_lr=6e-4
dead_reinit=0
shape="-e 124m"
batch=16
seq_len=1024
device=cuda
plot=1
report_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        -o|--out) out=${2:?"$1 needs a value"}; shift 2 ;;
        --steps) steps=${2:?"$1 needs a value"}; shift 2 ;;
        --lambda) lambda=${2:?"$1 needs a value"}; shift 2 ;;
        --scratch-lambda) scratch_lambda=${2:?"$1 needs a value"}; shift 2 ;;
        --ramp) ramp=${2:?"$1 needs a value"}; shift 2 ;;
        --lr) lr=${2:?"$1 needs a value"}; shift 2 ;;
        --finetune-lr) finetune_lr=${2:?"$1 needs a value"}; shift 2 ;;
        --dead-reinit) dead_reinit=${2:?"$1 needs a value"}; shift 2 ;;
        --shape) shape=${2:?"$1 needs a value"}; shift 2 ;;
        --batch) batch=${2:?"$1 needs a value"}; shift 2 ;;
        --seq-len) seq_len=${2:?"$1 needs a value"}; shift 2 ;;
        --device) device=${2:?"$1 needs a value"}; shift 2 ;;
        --no-plot) plot=0; shift ;;
        --report-only) report_only=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown flag '$1' (see --help)" ;;
    esac
done
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 4 ] || die "--steps $steps: a whole number of at least 4"
[ "$device" = cuda ] || [ "$device" = cpu ] || die "--device $device: cuda or cpu"
[ "$report_only" -eq 1 ] || [ -x ./train_gpt_sparse ] || die "./train_gpt_sparse not found: run from the repository root after make"
if [ "$plot" -eq 1 ]; then
    command -v gnuplot > /dev/null 2>&1 || die "gnuplot is not installed (apt-get install gnuplot-nox), or give --no-plot"
fi
steps_b=$((steps / 4))
steps_c=$((steps + steps_b))
ramp=${ramp:-$((steps / 32 > 0 ? steps / 32 : 1))}
warmup_b=$((steps / 80 > 0 ? steps / 80 : 1))
tokens_per_step=$((batch * seq_len))
read -r -a shape_flags <<< "$shape"
common=(-b "$batch" -t "$seq_len" --device "$device" -s 0 -m 20 --overwrite 1)
mkdir -p "$out"

# run NAME FLAGS...: one training run into $out/NAME, its console output in $out/NAME/train.log
run() {
    local name=$1; shift
    mkdir -p "$out/$name"
    echo "($name) ./train_gpt_sparse $*" | tee "$out/$name/command.txt"
    local t0=$SECONDS
    if ! ./train_gpt_sparse "$@" -o "$out/$name" > "$out/$name/train.log" 2>&1; then
        tail -n 5 "$out/$name/train.log" >&2
        die "run ($name) failed: see $out/$name/train.log"
    fi
    echo "($name) done in $((SECONDS - t0)) s: $(grep -E '^step +[0-9]+ \| val ce' "$out/$name/train.log" | tail -n 1)"
}

start=$SECONDS
if [ "$report_only" -eq 0 ]; then
    echo "ReLUfication experiment: (a) $steps, (b) $steps_b, (c) $steps_c steps of $tokens_per_step tokens; lambda $lambda in (b)" \
         "(ramped over $ramp steps), $scratch_lambda in (c); output in $out"
    run a "${shape_flags[@]}" "${common[@]}" --activation silu --untied-head 1 -a 0 -x "$steps" -l "$lr" -u 100 \
        -v $((steps / 8 > 0 ? steps / 8 : 1)) -n 0
    model_a="$out/a/model_$(printf %08d "$steps").bin"
    [ -f "$model_a" ] || die "run (a) wrote no $model_a"
    run b "${common[@]}" --init-from "$model_a" --activation relu -a "$lambda" --l1-ramp "$ramp" -x "$steps_b" \
        -l "$finetune_lr" -u "$warmup_b" -v $((steps_b / 8 > 0 ? steps_b / 8 : 1)) -n 0 -r 1338 --dead-reinit "$dead_reinit"
    run c "${shape_flags[@]}" "${common[@]}" --activation relu --untied-head 1 -a "$scratch_lambda" -x "$steps_c" -l "$lr" -u 100 \
        -v $((steps / 8 > 0 ? steps / 8 : 1)) -n 0 --dead-reinit "$dead_reinit"
fi

# ----------------------------------------------------------------------------
# the table: per run, the last val CE, and the mean over its last 20 steps of the training batches' L0
# (firing units per token, averaged over layers), dead fraction and tok/s (the first step left out)
hidden=$(sed -n 's/^model: .*, H \([0-9][0-9]*\), .*/\1/p' "$out/a/train.log" | head -n 1)
[ -n "$hidden" ] || die "$out/a/train.log has no model line"
summary() { # summary NAME: steps val_ce first_val_ce l0 dead tok_per_s
    local log="$out/$1/log.jsonl"
    [ -f "$log" ] || die "$log is missing"
    awk '
        function num(key,   m) { if (match($0, "\"" key "\":[-0-9.e+]+")) return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3); return "" }
        /"type":"val"/ { v = num("val_ce"); if (first == "") first = v; last = v }
        /"type":"train"/ { n++; step[n] = num("step"); l0[n] = num("l0_mean"); dead[n] = num("dead"); tps[n] = num("tok_per_s") }
        END {
            if (n == 0 || last == "") { print "error"; exit }
            k = n < 20 ? n : 20
            for (i = n - k + 1; i <= n; i++) { sl += l0[i]; sd += dead[i] }
            for (i = 2; i <= n; i++) { st += tps[i] }
            printf "%d %.4f %.4f %.2f %.4f %.0f\n", step[n], last, first, sl / k, sd / k, (n > 1 ? st / (n - 1) : tps[1])
        }' "$log"
}
read -r sa va fa la da ta < <(summary a)
read -r sb vb fb lb db tb < <(summary b)
read -r sc vc fc lc dc tc < <(summary c)
for v in "$va" "$vb" "$vc"; do [ -n "$v" ] && [ "$v" != error ] || die "a run's log has no training or validation line"; done

pct() { awk -v x="$1" -v h="$hidden" 'BEGIN {printf "%.2f", 100 * x / h}'; }
delta() { awk -v x="$1" -v r="$va" 'BEGIN {printf "%+.2f%%", 100 * (x - r) / r}'; }
mtok() { awk -v s="$1" -v t="$tokens_per_step" 'BEGIN {printf "%.2f", s * t / 1e6}'; }
{
    echo "| run | steps | tokens (M) | val CE | vs (a) | mean L0 (% of H = $hidden) | dead % | tok/s |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    echo "| (a) dense SiLU, from scratch | $sa | $(mtok "$sa") | $va | ref. | 100 (g > 0: $(pct "$la")) | - | $ta |"
    echo "| (b) (a) ReLUfied + L1 (lambda $lambda, ramp $ramp) | $sb | $(mtok "$sb") (+ (a)'s) | $vb | $(delta "$vb") |" \
         "$(pct "$lb") | $(awk -v d="$db" 'BEGIN {printf "%.1f", 100 * d}') | $tb |"
    echo "| (c) ReLU + L1 (lambda $scratch_lambda), from scratch | $sc | $(mtok "$sc") | $vc | $(delta "$vc") | $(pct "$lc") |" \
         "$(awk -v d="$dc" 'BEGIN {printf "%.1f", 100 * d}') | $tc |"
    echo
    echo "val CE of (a)'s weights with ReLU, before any fine-tuning (step 0 of (b)): $fb."
    echo "L0: the training batches' firing units per token (g > 0), averaged over layers and the last 20 steps;"
    echo "a SiLU unit is never zero, so (a) computes all H (its g > 0 count is what ReLU would keep at once)."
} > "$out/results.md"
{
    echo "run,steps,tokens,val_ce,val_ce_delta_pct,l0_mean,l0_pct_h,dead_pct,tok_per_s"
    for r in "a $sa $va $la $da $ta" "b $sb $vb $lb $db $tb" "c $sc $vc $lc $dc $tc"; do
        read -r name s v l d t <<< "$r"
        awk -v n="$name" -v s="$s" -v v="$v" -v l="$l" -v d="$d" -v t="$t" -v r="$va" -v h="$hidden" -v tps="$tokens_per_step" \
            'BEGIN {printf "%s,%d,%d,%s,%.4f,%s,%.4f,%.2f,%s\n", n, s, s * tps, v, 100 * (v - r) / r, l, 100 * l / h, 100 * d, t}'
    done
} > "$out/results.csv"
echo
cat "$out/results.md"

# ----------------------------------------------------------------------------
# the plot: val CE and L0 (% of H) against the tokens each model has seen; (b) starts where (a) ends
if [ "$plot" -eq 1 ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    offset_b=$((sa * tokens_per_step))
    for r in a b c; do
        off=0
        [ "$r" = b ] && off=$offset_b
        awk -v off="$off" -v tps="$tokens_per_step" -v h="$hidden" -v val="$tmp/$r.val" -v l0="$tmp/$r.l0" '
            function num(key) { if (match($0, "\"" key "\":[-0-9.e+]+")) return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3); return "" }
            /"type":"val"/ { print (off + num("step") * tps) / 1e6, num("val_ce") > val }
            /"type":"train"/ { print (off + num("step") * tps) / 1e6, 100 * num("l0_mean") / h > l0 }' "$out/$r/log.jsonl"
    done
    # val CE from just below the best to 1.2 nats above it: the first evaluations (about ln V) are off the top
    ce_lo=$(cat "$tmp"/*.val | awk 'NR == 1 || $2 < lo {lo = $2} END {printf "%.2f", lo - 0.1}')
    if gnuplot -e 'set terminal pngcairo' > /dev/null 2>&1; then term='pngcairo enhanced font "DejaVu Sans,11"'; else term='png'; fi
    gnuplot <<EOF || die "gnuplot failed"
set terminal $term size 1200,500
set output "$out/relufy.png"
set multiplot layout 1, 2 title "ReLUfication of a dense SiLU model (lambda $lambda) against ReLU + L1 from scratch (lambda $scratch_lambda)"
set grid lc rgb "#dddddd"
set key top right
set xlabel "tokens seen (M)"
set ylabel "val CE (nats)"
set title "validation CE"
set yrange [$ce_lo:$ce_lo + 1.3]
set arrow 1 from first $(mtok "$sa"), graph 0 to first $(mtok "$sa"), graph 1 nohead dt 2 lc rgb "#999999"
set label 1 "(a) ends, (b) starts" at first $(mtok "$sa"), graph 0.03 offset 0.5, 0 tc rgb "#777777"
plot "$tmp/a.val" using 1:2 with linespoints pt 7 lw 2 lc rgb "#444444" title "(a) dense SiLU", \
     "$tmp/b.val" using 1:2 with linespoints pt 7 lw 2 lc rgb "#cc3333" title "(b) (a) ReLUfied + L1", \
     "$tmp/c.val" using 1:2 with linespoints pt 7 lw 2 lc rgb "#3366cc" title "(c) ReLU + L1 from scratch"
set ylabel "mean L0, % of H (log scale)"
set title "firing FFN units per token (training batches)"
set logscale y
set yrange [0.05:100]
unset label 1
set arrow 2 from graph 0, first 3 to graph 1, first 3 nohead dt 2 lc rgb "#3366cc"
set label 2 "3% of H" at graph 0.01, first 3 offset 0, 0.7 tc rgb "#3366cc"
plot "$tmp/a.l0" using 1:2 with lines lw 2 lc rgb "#444444" title "(a) g > 0 (SiLU: all H compute)", \
     "$tmp/b.l0" using 1:2 with lines lw 2 lc rgb "#cc3333" title "(b)", \
     "$tmp/c.l0" using 1:2 with lines lw 2 lc rgb "#3366cc" title "(c)"
unset multiplot
EOF
    echo "plot: $out/relufy.png"
fi
echo "total: $((SECONDS - start)) s"
