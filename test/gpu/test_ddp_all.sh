#!/usr/bin/env bash
# Data parallelism on every GPU of this machine (N >= 3; test_ddp.sh covers 2):
# an N-GPU run follows 1-GPU runs of the same global batch (one micro-batch,
# and N accumulated ones) within bf16 noise, and an N-GPU checkpoint resumes on
# 2 GPUs (re-sharded optimizer state) and follows the N-GPU run; with
# FFN=sparse, hot units chosen alike on every GPU.
set -u
cd "$(dirname "$0")/../.."
TEST_NAME=ddp_all
. test/check.sh
source test/gpu/ddp_lib.sh 3 # skips with fewer GPUs
# the default peak learning rate, not the small model's 3e-3: there its loss spikes near step 16, and the
# different roundings of one micro-batch of N (other product shapes than N micro-batches of 1) part the
# runs there by up to 0.035 (dense and auto alike, dev/RESULTS.md "Data parallelism")
for i in "${!small[@]}"; do if [ "${small[$i]}" = -l ]; then small[$((i + 1))]=1e-3; fi; done
n=$gpus
tokens=$((n * 128))
echo "ddp_all: $n GPUs, FFN path $ffn, $tokens tokens per step"

scripts/launch_local.sh "$n" "${small[@]}" -b 1 -o "$work/all" > "$work/all.txt" 2>&1
check "$n-GPU run exits 0" test $? -eq 0
check "$n processes are announced" grep -q "processes: $n (from environment), one GPU each" "$work/all.txt"
check "$n-GPU log has 20 steps" test "$(losses "$work/all" | wc -l)" -eq 20
./train_gpt_sparse "${small[@]}" -b "$n" -o "$work/one" > "$work/one.txt" 2>&1
check "1-GPU run (one micro-batch of $n) exits 0" test $? -eq 0
./train_gpt_sparse "${small[@]}" -b 1 -d "$tokens" -o "$work/acc" > "$work/acc.txt" 2>&1
check "1-GPU run ($n accumulated micro-batches) exits 0" test $? -eq 0
d_one=$(max_diff "$work/all" "$work/one"); d_acc=$(max_diff "$work/all" "$work/acc")
echo "ddp_all: max |loss difference| over 20 steps: $n GPUs vs 1 GPU 1x$n: $d_one, vs 1 GPU ${n}x1: $d_acc"
check "$n GPUs follow 1 GPU with one micro-batch ($d_one)" below "$d_one" 0.02
check "$n GPUs follow 1 GPU with accumulation ($d_acc)" below "$d_acc" 0.01
# where the runs part, the evidence side by side: each run's FFN path changes, then the losses step by step
if [ "$ffn" != dense ]; then
    for run in all one acc; do grep -E "^ffn: (layer [0-9]+ ->|hot units: costs)" "$work/$run.txt" | sed "s/^/  $run: /"; done
    join <(losses "$work/all") <(losses "$work/one") | join - <(losses "$work/acc") |
        awk -v n="$n" '{printf "  step %2d: %d GPUs %s | 1 GPU 1x%d %s | 1 GPU %dx1 %s\n", $1, n, $2, n, $3, n, $4}'
fi

# hot units at a fixed rate (FFN=sparse): every process chooses them from the firing counts of all and
# takes back its own shares of the permuted optimizer state (uneven where N does not divide a bucket)
if [ "$ffn" = sparse ]; then
    scripts/launch_local.sh "$n" "${small[@]}" --hot-rate 0.05 -b 1 -o "$work/hot_all" > "$work/hot_all.txt" 2>&1
    check "$n-GPU run with hot units exits 0" test $? -eq 0
    check "the $n-GPU run chooses hot units" grep -qE "^ffn: layer [0-9]+ -> split h=" "$work/hot_all.txt"
    ./train_gpt_sparse "${small[@]}" --hot-rate 0.05 -b 1 -d "$tokens" -o "$work/hot_one" > "$work/hot_one.txt" 2>&1
    check "the 1-GPU run with hot units exits 0" test $? -eq 0
    d=$(max_diff "$work/hot_all" "$work/hot_one")
    echo "ddp_all: hot units: max |loss difference| over 20 steps, $n GPUs vs 1 GPU ${n}x1: $d"
    check "hot units: the $n-GPU run follows the 1-GPU run ($d)" below "$d" 0.01
fi

if [ $((n % 2)) -eq 0 ]; then # the same tokens per step on 2 GPUs
    mkdir -p "$work/to_two"
    cp "$work/all"/model_00000010.bin "$work/all"/state_00000010_* "$work/all"/log.jsonl "$work/to_two/"
    check "the $n-GPU checkpoint has a state file per rank" test "$(ls "$work/all"/state_00000010_* | wc -l)" -eq "$n"
    scripts/launch_local.sh 2 "${small[@]}" -b $((n / 2)) -o "$work/to_two" -y 1 > "$work/to_two.txt" 2>&1
    check "$n-GPU checkpoint resumes on 2 GPUs" test $? -eq 0
    check "the re-sharding is announced" grep -q "resuming $n processes' optimizer state on 2: re-sharded" "$work/to_two.txt"
    d=$(max_diff "$work/to_two" "$work/all")
    echo "ddp_all: resumed on 2 GPUs from step 10: max |loss difference| to the $n-GPU run $d"
    check "$n -> 2 GPU resume follows the $n-GPU run ($d)" below "$d" 0.01
else
    echo "SKIP ddp_all: the resume on 2 GPUs (needs an even number of GPUs, this machine has $n)"
fi
finish
