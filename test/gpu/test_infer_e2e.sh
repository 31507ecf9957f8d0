#!/usr/bin/env bash
# GPU inference end to end: a small model trained on the GPU with a strong L1
# term (sparse gates), then infer: greedy text the same with --ffn dense and
# --ffn twell (24 tokens; the TwELL prefill forced at any size) and as the CPU
# path's (the first 8); a batch of prompts (a file, one per line) the same as
# each prompt alone; stdin; seeded sampling reproducible; the stops; a bad
# prompt's one-line error; build/dev/bench_infer on the checkpoint and on a
# synthetic-sparse random model, and a small prefill running the dense FFN by
# default.
set -u
cd "$(dirname "$0")/../.."
TEST_NAME=infer_e2e
. test/check.sh

./train_gpt_sparse --layers 2 --dim 128 --heads 4 --kv-heads 2 --hidden 512 -b 8 -t 128 -u 20 -l 3e-3 -a 2e-3 \
    -s 0 -m 4 --final-val-batches 4 -x 600 -v 0 -n 0 -o "$work/a" > "$work/train.txt" 2>&1
check "GPU training exits 0" test $? -eq 0
grep "step   600/600" "$work/train.txt"
model="$work/a/model_00000600.bin"
# on its training text; random token ids (bench_infer's prompts) make it several times more active
l0=$(sed -nE 's/^step   600\/600 .*\| l0 ([0-9.]+)\/512.*/\1/p' "$work/train.txt")
check "the L1-trained model is sparse: $l0 of 512 units fire per token in training" awk -v a="${l0:-999}" 'BEGIN {exit !(a < 64)}'

gen() { ./infer -m "$model" -t 0 -q 1 "$@"; }
# greedy tokens: the paths differ in summation order and rounding only, so they agree until two
# candidates tie to within that. Dense and TwELL round u and h alike (bf16): 24 tokens of 3 prompts.
# The CPU path is fp32 throughout: its first 8 tokens (an H200 run saw it part from bf16 at token 13
# of the second prompt, at a near tie between " son" and " king")
i=0
for p in "The sea" "It was a dark night, and" "And God said"; do
    i=$((i + 1))
    gen -p "$p" -n 24 --ffn dense > "$work/dense$i.txt" 2>&1
    check "GPU dense generation exits 0" test $? -eq 0
    gen -p "$p" -n 24 --ffn twell --twell-min-rows 0 > "$work/twell$i.txt" 2>&1
    check "GPU TwELL generation exits 0" test $? -eq 0
    check "greedy '$p': TwELL gives the dense path's 24 tokens" cmp -s "$work/dense$i.txt" "$work/twell$i.txt"
    gen -p "$p" -n 8 --device cpu > "$work/cpu$i.txt" 2>&1
    gen -p "$p" -n 8 > "$work/gpu$i.txt" 2>&1
    check "greedy '$p': the GPU gives the CPU path's first 8 tokens" cmp -s "$work/cpu$i.txt" "$work/gpu$i.txt"
    for f in dense twell cpu; do echo "  $f: $(tr '\n' ' ' < "$work/$f$i.txt")"; done
done
gen -p "The sea" -n 40 > "$work/twell.txt" 2>&1
check "generated text" test "$(wc -c < "$work/twell.txt")" -gt 20
gen -p "The sea" -n 40 --graph 0 > "$work/direct.txt" 2>&1
check "decode launched directly gives the graph's tokens" cmp -s "$work/direct.txt" "$work/twell.txt"
./infer -m "$model" -p "The sea" -n 10 -t 0 2> "$work/verbose.err" > /dev/null
check "the GPU and the FFN are announced" grep -q "on the GPU (.*), FFN twell" "$work/verbose.err"

# a batch: each prompt as it would come alone
printf 'The sea\nIt was a dark\n\nOnce upon a time there lived\n' > "$work/prompts.txt"
gen -f "$work/prompts.txt" -n 20 > "$work/batch.txt" 2>&1
check "batch generation exits 0" test $? -eq 0
: > "$work/expect.txt"
i=1
for p in "The sea" "It was a dark" "Once upon a time there lived"; do
    printf '[%d] ' $i >> "$work/expect.txt"
    gen -p "$p" -n 20 >> "$work/expect.txt" 2>&1
    i=$((i + 1))
done
check "a batch of 3 prompts of different lengths gives each prompt's own text" cmp -s "$work/batch.txt" "$work/expect.txt"
gen -f - -n 20 < "$work/prompts.txt" > "$work/batch_stdin.txt" 2>&1
check "prompt lines from stdin (-f -) give the same batch" cmp -s "$work/batch.txt" "$work/batch_stdin.txt"
printf 'The sea' | gen -n 40 > "$work/stdin.txt" 2>&1
check "piped stdin is one prompt" cmp -s "$work/stdin.txt" "$work/twell.txt"

./infer -m "$model" -p "It was" -n 30 -t 0.9 -k 40 --top-p 0.95 -s 7 > "$work/s1.txt" 2>/dev/null
./infer -m "$model" -p "It was" -n 30 -t 0.9 -k 40 --top-p 0.95 -s 7 > "$work/s2.txt" 2>/dev/null
check "GPU sampling is reproducible for a seed" cmp -s "$work/s1.txt" "$work/s2.txt"
./infer -m "$model" -p "x" -n 100000 -t 0 > /dev/null 2> "$work/long.txt"
check "GPU generation stops at max_seq_len or end of text" grep -qE "stopped at (max_seq_len|end of text)" "$work/long.txt"
./infer -m "$model" -p "x" -n 5 -t 0 > /dev/null 2> "$work/short.txt"
check "GPU generation stops at the token limit" grep -qE "generated 5 tokens .* stopped at token limit" "$work/short.txt"
printf 'fine\nbad \xff byte\n' > "$work/bad.txt"
expect_error "line 2) is not valid UTF-8 at byte 4" ./infer -m "$model" -f "$work/bad.txt"
expect_error "--ffn sparse: expected twell or dense" ./infer -m "$model" -p hi --ffn sparse

build/dev/bench_infer -m "$model" --batch 2 --length 64 -n 32 > "$work/bench.txt" 2>&1
check "bench_infer on the checkpoint exits 0" test $? -eq 0
check "bench_infer prints both paths and the ratio" grep -q "twell / dense: prefill" "$work/bench.txt"
cat "$work/bench.txt"
# (--hot 0: with hot units TwELL's count is the cold tail's)
build/dev/bench_infer --preset default --sparse-k 8 --batch 1 --length 128 -n 32 --twell-min-rows 0 --hot 0 \
    > "$work/bench_syn.txt" 2>&1
check "bench_infer on a synthetic-sparse preset exits 0" test $? -eq 0
check "the synthetic init is said" grep -q "SYNTHETIC-SPARSE" "$work/bench_syn.txt"
active=$(sed -nE 's/^TwELL: ([0-9.]+) active.*/\1/p' "$work/bench_syn.txt")
check "synthetic init: about k = 8 units fire ($active)" awk -v a="${active:-0}" 'BEGIN {exit !(a > 3 && a < 20)}'
cat "$work/bench_syn.txt"
build/dev/bench_infer --preset default --sparse-k 8 --batch 1 --length 128 -n 32 --twell-min-rows 0 > "$work/bench_hot.txt" 2>&1
check "bench_infer with hot units exits 0" test $? -eq 0
check "bench_infer says the hot units or the active ones" \
    grep -qE "^TwELL: [0-9.]+ active FFN units per token (in the cold tail, [0-9]+ hot units a layer run dense|\(mean)" \
    "$work/bench_hot.txt"
build/dev/bench_infer --preset default --sparse-k 8 --batch 1 --length 128 -n 8 > "$work/bench_small.txt" 2>&1
check "a prefill below --twell-min-rows runs the dense FFN, and says so" grep -q "ran the dense FFN" "$work/bench_small.txt"

finish
