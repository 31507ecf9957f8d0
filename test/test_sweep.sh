#!/usr/bin/env bash
# Tests of the L1 sweep on the CPU path with a tiny model: scripts/sweep_l1.sh
# trains one run per lambda and writes results.csv and results.md with the
# right rows and columns (the accuracy of --eval-file beside CE and L0, "-"
# without it); a finished sweep is skipped, an interrupted one
# resumes to the same logs and checkpoints as an uninterrupted one, a longer
# -x continues the runs; bad flags are one-line errors; the plots are valid
# PNG files (when gnuplot is installed); infer --analyze reports L0 per layer,
# per position and per token, its CE matches the trainer's validation, and
# ./analyze prints and writes the same bytes under its own flags.
set -u
cd "$(dirname "$0")/.." || exit 1
TEST_NAME=test_sweep
. test/check.sh

# 2 layers, D 64, H 128; 2 x 32 tokens per step; validation on 2 batches
tiny=(--layers 2 --dim 64 --heads 4 --hidden 128 -b 2 -t 32 -u 2 -l 3e-3 -m 2 --final-val-batches 2 -s 0)
# a multiple-choice evaluation of 4 examples at each validation
eval_args=(--eval-file test/data/eval/hellaswag_fixture.bin --eval-examples 4)
sweep() { scripts/sweep_l1.sh "$@"; }
csv_col() { # csv_col FILE COLUMN_NAME: the column's values, one per row
    awk -F, -v name="$2" 'NR == 1 {for (i = 1; i <= NF; i++) if ($i == name) c = i; next} {print $c}' "$1"
}
is_png() { [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }

# 1. bad flags: one clear line, non-zero exit
expect_error "unknown flag '--bogus'" sweep --bogus
expect_error "lambda 'abc' is not a non-negative number" sweep -l 0,abc -o "$work/e"
expect_error "lambda '-1e-5' is not a non-negative number" sweep -l -1e-5 -o "$work/e"
expect_error "lambda 0.0001 is given twice (1e-4)" sweep -l 1e-4,0.0001 -o "$work/e"
expect_error "$work/none not found: build it with 'make'" sweep --bin "$work/none" -o "$work/e"
expect_error "lambda is set by --lambdas" sweep -o "$work/e" -- -x 2 -a 1e-4
expect_error "resuming is automatic" sweep -o "$work/e" -- -y 1
expect_error "--out needs a value" sweep --out
expect_error "holds no run with a validation line" scripts/sweep_results.sh "$work"
check "no run directory made by a bad command" test ! -e "$work/e"

# 2. a sweep of two lambdas: tables with one row per lambda
sweep -l 0,1e-3 -o "$work/sw" -g cpu -- "${tiny[@]}" "${eval_args[@]}" -x 6 -v 3 -n 3 > "$work/sw.txt" 2>&1
check "sweep exits 0" test $? -eq 0
check "sweep trains on the CPU" grep -q "lambda 1e-3: training on the CPU" "$work/sw.txt"
check "each run has its directory, log and final checkpoint" \
    test -f "$work/sw/lambda_0/model_00000006.bin" -a -f "$work/sw/lambda_1e-3/model_00000006.bin"
check "each run records its command" grep -q -- "-a 1e-3 -o $work/sw/lambda_1e-3 " "$work/sw/lambda_1e-3/command.txt"
csv="$work/sw/results.csv"
check "results.csv: a header and 2 rows" test "$(wc -l < "$csv")" -eq 3
check "results.csv: every row has the header's columns" \
    awk -F, 'NR == 1 {n = NF} NF != n {bad = 1} END {exit bad || n != 21}' "$csv"
check "results.csv: per-layer columns" grep -q "l0_mean_layer0,l0_mean_layer1,l0_max_layer0,l0_max_layer1,dead_pct_layer0,dead_pct_layer1" "$csv"
check "results.csv: lambdas in order" test "$(csv_col "$csv" lambda | tr '\n' ' ')" = "0 1e-3 "
check "results.csv: 6 steps" test "$(csv_col "$csv" steps | tr '\n' ' ')" = "6 6 "
val_log=$(sed -n 's/^{"type":"val","step":6,"val_ce":\([^,]*\),.*/\1/p' "$work/sw/lambda_1e-3/log.jsonl")
check "results.csv: val CE is the last val line ($val_log)" test "$(csv_col "$csv" val_ce | tail -n 1)" = "$val_log"
check "results.csv: lambda 0 is the reference" test "$(csv_col "$csv" val_ce_delta_pct | head -n 1)" = "0.0000"
delta=$(csv_col "$csv" val_ce_delta_pct | tail -n 1)
check "results.csv: the change against lambda 0 ($delta %)" awk -v d="$delta" -v a="$(csv_col "$csv" val_ce | head -n 1)" \
    -v b="$val_log" 'BEGIN {x = 100 * (b - a) / a - d; exit !(x < 1e-3 && x > -1e-3)}'
l0_last=$(grep '"type":"train"' "$work/sw/lambda_0/log.jsonl" | tail -n 1 | sed -E 's/.*"layers":\{"l0_mean":\[([^]]*)\].*/\1/')
check "results.csv: per-layer L0 from the last train line" test "$(awk -F, 'NR == 2 {print $16 "," $17}' "$csv")" = "$l0_last"
check "results.csv: L0 as % of H 128" awk -F, 'NR > 1 {x = $9 - 100 * $8 / 128; if (x > 1e-3 || x < -1e-3) bad = 1} END {exit bad}' "$csv"
check "results.csv: tok/s is a positive number" awk -F, 'NR > 1 && !($12 > 0) {bad = 1} END {exit bad}' "$csv"
eval_log=$(grep '"type":"eval","step":6' "$work/sw/lambda_1e-3/log.jsonl")
for f in acc_norm acc; do
    v=$(echo "$eval_log" | sed -E "s/.*\"$f\":([0-9.e+-]+).*/\1/")
    check "results.csv: $f is the last eval line's ($v)" test "$(csv_col "$csv" $f | tail -n 1)" = "$v"
done
check "results.csv: 4 examples evaluated" test "$(csv_col "$csv" eval_n | tr '\n' ' ')" = "4 4 "
check "results.csv: no peak memory on the CPU" test "$(csv_col "$csv" peak_mem_gib | tr '\n' ' ')" = "- - "
md="$work/sw/results.md"
check "results.md: header, separator, 2 rows" test "$(grep -c '^|' "$md")" -eq 4
check "results.md: every row has 11 cells" awk -F'|' '/^\|/ && NF != 13 {bad = 1} END {exit bad}' "$md"
check "results.md: acc_norm (acc)" grep -qE '^\| 1e-3 \| 6 \| [0-9.]+ \| [-+0-9.]+% \| [01]\.[0-9]{4} \([01]\.[0-9]{4}\) \|' "$md"
check "results.md: lambda 0 is the reference" grep -q '^| 0 | 6 | [0-9.]* | ref\. |' "$md"
check "results.md: the target line" grep -q "^Target (mean L0 <= 2% of H with val CE within 3% of lambda = 0): met by" "$md"
check "results.md: per-layer L0 max as a / b" grep -qE '^\| 1e-3 \|.*\| [0-9]+ / [0-9]+ \|' "$md"

# 2b. several GPUs: one run per GPU at a time, through CUDA_VISIBLE_DEVICES (with no GPU
# present, as here, each run falls back to the CPU, which still tests the scheduling)
OMP_NUM_THREADS=1 sweep -l 0,1e-3,2e-3 -o "$work/par" -g 0,1 -- "${tiny[@]}" -x 3 -v 3 -n 3 > "$work/par.txt" 2>&1
check "parallel sweep exits 0" test $? -eq 0
check "parallel sweep starts a run on each GPU before any ends" \
    awk '/done in/ {exit} /training on GPU 0/ {a = 1} /training on GPU 1/ {b = 1} END {exit !(a && b)}' "$work/par.txt"
check "the third run takes the GPU that is free first" test "$(grep -c "lambda 2e-3: training on GPU [01]" "$work/par.txt")" -eq 1
check "each run sees its GPU" grep -q "^=== .* on GPU 1: " "$work/par/lambda_1e-3/train.log"
check "parallel sweep: 3 rows" test "$(wc -l < "$work/par/results.csv")" -eq 4
check "no --eval-file: no accuracy" test "$(csv_col "$work/par/results.csv" acc_norm | tr '\n' ' ')" = "- - - "
check "no --eval-file: no accuracy in results.md" grep -qE '^\| 2e-3 \| 3 \| [0-9.]+ \| [-+0-9.]+% \| - \|' "$work/par/results.md"

# 3. the plots
if command -v gnuplot > /dev/null 2>&1; then
    for f in val_ce_vs_l0 l0_per_layer loss_curves acc_vs_l0; do
        check "$f.png is a PNG file" is_png "$work/sw/$f.png"
    done
    check "the plots are not empty" test "$(wc -c < "$work/sw/loss_curves.png")" -gt 5000
    check "no accuracy plot without --eval-file" test ! -e "$work/par/acc_vs_l0.png"
else
    echo "SKIP sweep: the PNG checks of the plots (gnuplot is not installed: apt-get install gnuplot-nox)"
    check "the sweep says why it made no plots" grep -q "apt-get install gnuplot-nox" "$work/sw.txt"
fi

# without gnuplot: the sweep still writes its tables and says what to install; the plot script refuses
mkdir -p "$work/bin"
for f in /usr/local/bin/* /usr/bin/* /bin/*; do
    case "${f##*/}" in gnuplot*) ;; *) [ -e "$work/bin/${f##*/}" ] || ln -s "$f" "$work/bin/${f##*/}" ;; esac
done
rm -f "$work/sw/results.csv"
PATH="$work/bin" scripts/sweep_l1.sh --report-only -o "$work/sw" > "$work/nognuplot.txt" 2>&1
check "no gnuplot: the report still exits 0" test $? -eq 0
check "no gnuplot: results.csv is rewritten" test -f "$work/sw/results.csv"
check "no gnuplot: the sweep names the package" grep -q "plots: skipped, gnuplot is not installed (apt-get install gnuplot-nox" "$work/nognuplot.txt"
expect_error "gnuplot is not installed: apt-get install gnuplot-nox" env PATH="$work/bin" scripts/plot_sweep.sh "$work/sw"

# 4. a finished sweep is skipped; a shorter -x is an error; a longer -x continues both runs
cp "$work/sw/lambda_0/log.jsonl" "$work/log_before"
sweep -l 0,1e-3 -o "$work/sw" -g cpu -- "${tiny[@]}" "${eval_args[@]}" -x 6 -v 3 -n 3 > "$work/sw2.txt" 2>&1
check "rerun exits 0" test $? -eq 0
check "rerun skips finished runs" test "$(grep -c "finished .*, skipped" "$work/sw2.txt")" -eq 2
check "rerun trains nothing" cmp -s "$work/log_before" "$work/sw/lambda_0/log.jsonl"
expect_error "past -x 3" sweep -l 0 -o "$work/sw" -g cpu -- "${tiny[@]}" -x 3 -v 3 -n 3
sweep -l 0,1e-3 -o "$work/sw" -g cpu -- "${tiny[@]}" "${eval_args[@]}" -x 9 -v 3 -n 3 > "$work/sw3.txt" 2>&1
check "longer -x exits 0" test $? -eq 0
check "longer -x resumes both runs" test "$(grep -c "resuming on the CPU" "$work/sw3.txt")" -eq 2
check "longer -x: the trainer resumed from step 6" grep -q "resumed from .*model_00000006.bin at step 6" "$work/sw/lambda_1e-3/train.log"
check "longer -x: the table shows 9 steps" test "$(csv_col "$csv" steps | tr '\n' ' ')" = "9 9 "

# 5. interrupted: stop the sweep during its first run, then run it again
sweep -l 0,1e-3 -o "$work/ref" -g cpu -- "${tiny[@]}" "${eval_args[@]}" -x 24 -v 6 -n 3 > /dev/null 2>&1
check "uninterrupted reference sweep exits 0" test $? -eq 0
scripts/sweep_l1.sh -l 0,1e-3 -o "$work/int" -g cpu -- "${tiny[@]}" "${eval_args[@]}" -x 24 -v 6 -n 3 > "$work/int1.txt" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [ -f "$work/int/lambda_0/state_00000003_00000.bin" ] && break
    sleep 0.05
done
kill -TERM "$pid" 2> /dev/null
wait "$pid"; rc=$?
check "interrupted sweep exits 130 (got $rc)" test $rc -eq 130
check "interrupted sweep says how to resume" grep -q "run the same command again to resume" "$work/int1.txt"
check "interrupted run is unfinished" test ! -f "$work/int/lambda_0/model_00000024.bin"
check "no trainer left running" bash -c '! ps -eo args | grep -v grep | grep -q -- "-o $0/int/lambda_"' "$work"
# the second run was interrupted before its first checkpoint: a log and no checkpoint
mkdir -p "$work/int/lambda_1e-3"
echo '{"type":"train","step":1,"loss":0}' > "$work/int/lambda_1e-3/log.jsonl"
sweep -l 0,1e-3 -o "$work/int" -g cpu -- "${tiny[@]}" "${eval_args[@]}" -x 24 -v 6 -n 3 > "$work/int2.txt" 2>&1
check "resumed sweep exits 0" test $? -eq 0
check "a run with a checkpoint resumes" grep -q "lambda 0: resuming on the CPU" "$work/int2.txt"
check "a run without one starts over" grep -q "lambda 1e-3: training on the CPU" "$work/int2.txt"
for v in 0 1e-3; do
    check "lambda $v: resumed log equals the uninterrupted one" \
        cmp -s <(strip_timing "$work/ref/lambda_$v/log.jsonl") <(strip_timing "$work/int/lambda_$v/log.jsonl")
    check "lambda $v: final checkpoint equals the uninterrupted one" \
        cmp -s "$work/ref/lambda_$v/model_00000024.bin" "$work/int/lambda_$v/model_00000024.bin"
done
check "resumed table equals the uninterrupted one (but tok/s)" \
    cmp -s <(cut -d, -f1-11,13- "$work/ref/results.csv") <(cut -d, -f1-11,13- "$work/int/results.csv")

# 6. infer --analyze on the run's checkpoint and val data: the same 2 batches of 2 x 32 as its validation
model="$work/ref/lambda_1e-3/model_00000024.bin"
./infer -m "$model" --analyze "data/corpus_val_*.bin" --analyze-batches 2 --analyze-batch 2 --analyze-seq-len 32 \
    --analyze-min-count 2 --analyze-top 5 --analyze-out "$work/an.json" > "$work/an.txt" 2> "$work/an.err"
check "analyze exits 0" test $? -eq 0
check "analyze names the model" grep -q "model: $model (step 24, 2 layers, D 64, H 128)" "$work/an.err"
check "analyze: 128 tokens" grep -q "2 batches of 2 x 32 tokens = 128 tokens" "$work/an.txt"
val24=$(sed -n 's/^{"type":"val","step":24,"val_ce":\([^,]*\),.*/\1/p' "$work/ref/lambda_1e-3/log.jsonl")
ce=$(sed -n 's/^ce \([0-9.]*\) .*/\1/p' "$work/an.txt")
check "analyze: CE $ce is the trainer's val CE $val24" awk -v a="$ce" -v b="$val24" 'BEGIN {x = a - b; exit !(x < 1e-3 && x > -1e-3)}'
check "analyze: a row per layer and one for all" test "$(grep -cE '^ +(0|1|all) +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9.]+$' "$work/an.txt")" -eq 3
check "analyze: position buckets 0 1 2 3 4-7 8-15 16-31" \
    test "$(awk '/^L0 per position/ {on = 1; next} on && /^$/ {on = 0} on && $1 ~ /^[0-9]/ {printf "%s ", $1}' "$work/an.txt")" = "0 1 2 3 4-7 8-15 16-31 "
check "analyze: 5 most and 5 least active tokens" test "$(grep -cE '^ +[1-5] +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+  ".*"$' "$work/an.txt")" -eq 10
check "analyze: most active tokens in decreasing order" \
    awk '/most active/ {on = 1; next} /least active/ {on = 0} on && $1 ~ /^[0-9]+$/ {if (n++ && $4 > prev) bad = 1; prev = $4} END {exit bad || n != 5}' "$work/an.txt"
check "analyze: tokens occur at least twice" \
    awk '/active tokens/ {on = 1; next} on && $1 ~ /^[0-9]+$/ && $3 < 2 {bad = 1} END {exit bad}' "$work/an.txt"
layers_txt=$(awk '$1 ~ /^[01]$/ && NF == 5 {printf "%s,", $2}' "$work/an.txt")
check "analyze: layer means agree with the JSON" \
    awk -v t="$layers_txt" -v j="$(sed -E 's/.*"layer":\{"l0_mean":\[([^]]*)\].*/\1/' "$work/an.json")" \
    'BEGIN {n = split(t, a, ","); split(j, b, ","); for (i = 1; i < n; i++) {x = a[i] - b[i]; if (x > 0.01 || x < -0.01) bad = 1}; exit bad || n != 3}'
check "analyze: JSON has 32 positions" test "$(sed -E 's/.*"position":\{"l0_mean":\[([^]]*)\].*/\1/' "$work/an.json" | tr ',' '\n' | wc -l)" -eq 32
check "analyze: JSON has the token lists" grep -q '"most_active":\[{"id":[0-9]*,"count":[0-9]*,"l0_mean":[0-9.e+-]*,"text":"' "$work/an.json"
if command -v jq > /dev/null 2>&1; then
    check "analyze: the JSON parses" jq -e '.tokens == 128 and (.layer.l0_mean | length) == 2 and (.least_active | length) == 5' "$work/an.json" > /dev/null
    check "analyze: positions average to the mean L0" \
        jq -e '((.position.l0_mean | add / length) - .l0_mean | fabs) < 1e-3' "$work/an.json" > /dev/null
else
    echo "SKIP sweep: the analysis JSON parsed by jq (jq is not installed: apt-get install jq)"
fi
# ./analyze is the same code: the same report (but the time it took and the JSON's path), JSON and model line
./analyze -m "$model" "data/corpus_val_*.bin" --batches 2 -b 2 -t 32 --min-count 2 --top 5 -o "$work/an_tool.json" \
    > "$work/an_tool.txt" 2> "$work/an_tool.err"
check "./analyze exits 0" test $? -eq 0
untimed() { sed -E 's/ \([0-9.]+ s\)$//; s/^wrote .*/wrote/' "$1"; }
check "./analyze prints what infer --analyze prints" cmp -s <(untimed "$work/an.txt") <(untimed "$work/an_tool.txt")
check "./analyze writes the JSON infer --analyze writes" cmp -s "$work/an.json" "$work/an_tool.json"
check "./analyze names the model as infer --analyze does" cmp -s "$work/an.err" "$work/an_tool.err"
./analyze --help > "$work/an_help.txt" 2>&1
check "./analyze --help exits 0" test $? -eq 0
check "./analyze --help lists --batches" grep -q -- "--batches" "$work/an_help.txt"
expect_error "--seq-len 64: the model $model takes 2 to 32 tokens" ./analyze -m "$model" "data/corpus_val_*.bin" -t 64
expect_error "one shard pattern, got 'data/corpus_val_000000.bin' and 'data/corpus_train_000001.bin'" \
    ./analyze -m "$model" data/corpus_val_000000.bin data/corpus_train_000001.bin
expect_error "no shards given" ./analyze -m "$model"
expect_error "--analyze reads shards, not a prompt" ./infer -m "$model" --analyze "data/corpus_val_*.bin" -p hi
expect_error "--analyze-out needs --analyze" ./infer -m "$model" -p hi --analyze-out "$work/x.json"
expect_error "--analyze-seq-len 64: the model $model takes 2 to 32 tokens" \
    ./infer -m "$model" --analyze "data/corpus_val_*.bin" --analyze-seq-len 64
expect_error "no files match the shard pattern '$work/nothing_*.bin'" ./infer -m "$model" --analyze "$work/nothing_*.bin"

finish
