#!/usr/bin/env bash
# End-to-end runs of the FFN hot/cold split on the CPU path (llmc/ffn/split.h): with a
# fixed hot rate (--hot-rate) the sparse layers' hot sets change during training and
# are logged, the loss stays within float noise of --ffn dense, and a run
# resumed from a checkpoint taken after the hot sets changed, and before they
# change again, repeats the uninterrupted one bit for bit (the hot units are the
# first rows of the saved weights; their number, the step of their last change
# and the rate are in the state file).
set -u
cd "$(dirname "$0")/.."
TEST_NAME=hot
. test/check.sh

# a tiny model whose units fire often (a large lambda would make them quiet): with a rate of 5% many are hot
tiny=(--layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 256 -t 64 -b 4 -u 5 -l 3e-3 -s 0 -m 4 --final-val-batches 4 -v 0 -a 1e-4 -x 32 -n 16)

./train_gpt_sparse "${tiny[@]}" --ffn sparse --hot-rate 0.05 -o "$work/hot" > "$work/hot.txt" 2>&1
check "hot run exits 0" test $? -eq 0
check "the rate is announced" grep -q "ffn: hot units: a sparse layer's units firing for more than 5.000% of the tokens run dense" "$work/hot.txt"
check "hot sets are chosen and logged" grep -qE "^ffn: layer [01] -> split h=[1-9][0-9]* \(was sparse; " "$work/hot.txt"
check "a hot set changes after the first" awk '/^ffn: layer [01] -> split h=[0-9]+ \(was split h=[1-9]/ {e = 1} END {exit !e}' "$work/hot.txt"
./train_gpt_sparse "${tiny[@]}" --ffn dense -o "$work/dense" > /dev/null 2>&1
check "dense run exits 0" test $? -eq 0
paste <(json_field "$work/hot/log.jsonl" train ce) <(json_field "$work/dense/log.jsonl" train ce) > "$work/ce.txt"
check "32 steps logged by both" test "$(wc -l < "$work/ce.txt")" -eq 32
check "the CE follows the dense run's (within 1e-3)" awk '{d = $1 - $2; if (d < 0) d = -d; if (d > 1e-3 * $2) bad = 1} END {exit bad}' "$work/ce.txt"

mkdir -p "$work/resumed"
cp "$work/hot/model_00000016.bin" "$work/hot/state_00000016_00000.bin" "$work/hot/log.jsonl" "$work/resumed/"
./train_gpt_sparse "${tiny[@]}" --ffn sparse --hot-rate 0.05 -o "$work/resumed" -y 1 > "$work/resumed.txt" 2>&1
check "resumed run exits 0" test $? -eq 0
check "resumed log is identical" cmp -s <(strip_timing "$work/hot/log.jsonl") <(strip_timing "$work/resumed/log.jsonl")
check "resumed checkpoint is identical" cmp -s "$work/hot/model_00000032.bin" "$work/resumed/model_00000032.bin"

finish
