#!/usr/bin/env bash
# End-to-end runs of train_gpt_sparse on the GPU: the loss falls, a resumed run
# repeats the uninterrupted one bit for bit, and checkpoints move between the
# GPU and CPU paths; a dense SiLU model is ReLUfied.
set -u
cd "$(dirname "$0")/../.."
TEST_NAME=e2e_gpu
. test/check.sh
# (hot sets at a fixed rate: the default model turns sparse, and hot sets chosen from costs timed after the
# checkpoint may differ between a run and its resume, docs/TRAINING.md)
small=(--layers 2 --dim 128 --heads 4 --kv-heads 2 --hidden 256 -b 8 -t 128 -u 10 -l 3e-3 -s 0 -m 4 --final-val-batches 4
       --hot-rate 0.05)

./train_gpt_sparse "${small[@]}" -o "$work/a" -x 60 -v 30 -n 30 > "$work/a.txt" 2>&1
check "GPU training run exits 0" test $? -eq 0
check "the GPU is announced" grep -q "bf16 with fp32 master weights" "$work/a.txt"
first=$(json_field "$work/a/log.jsonl" train loss | head -n 1)
last=$(json_field "$work/a/log.jsonl" train loss | tail -n 5 | awk '{s += $1} END {print s / NR}')
check "GPU train loss falls ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a - 1.5)}'

mkdir -p "$work/b"
cp "$work/a/model_00000030.bin" "$work/a/state_00000030_00000.bin" "$work/a/log.jsonl" "$work/b/"
./train_gpt_sparse "${small[@]}" -o "$work/b" -x 60 -v 30 -n 30 -y 1 > "$work/b.txt" 2>&1
check "GPU resumed log is identical" cmp -s <(strip_timing "$work/a/log.jsonl") <(strip_timing "$work/b/log.jsonl")
check "GPU resumed checkpoint is identical" cmp -s "$work/a/model_00000060.bin" "$work/b/model_00000060.bin"

# a GPU checkpoint continues on the CPU, and a CPU checkpoint on the GPU
mkdir -p "$work/c"
cp "$work/a/model_00000030.bin" "$work/a/state_00000030_00000.bin" "$work/c/"
./train_gpt_sparse "${small[@]}" -o "$work/c" -x 33 -v 0 -n 0 -y 1 --device cpu > "$work/c.txt" 2>&1
check "GPU checkpoint resumes on the CPU" grep -q "step    33/33" "$work/c.txt"
cpu_loss=$(json_field "$work/c/log.jsonl" train loss | tail -n 1)
gpu_loss=$(json_field "$work/a/log.jsonl" train loss | sed -n 33p)
check "CPU continuation tracks the GPU run ($cpu_loss vs $gpu_loss)" awk -v a="$cpu_loss" -v b="$gpu_loss" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(d < 0.05)}'
./train_gpt_sparse "${small[@]}" -o "$work/c" -x 36 -v 0 -n 0 -y 1 > "$work/d.txt" 2>&1
check "CPU checkpoint resumes on the GPU" grep -q "step    36/36" "$work/d.txt"

# recomputing the FFN activations in the backward changes nothing but memory
./train_gpt_sparse "${small[@]}" -o "$work/r0" -x 8 -v 0 -n 0 > /dev/null 2>&1
./train_gpt_sparse "${small[@]}" -o "$work/r1" -x 8 -v 0 -n 0 --recompute 1 > /dev/null 2>&1
check "--recompute 1 gives the same steps" cmp -s <(strip_timing "$work/r0/log.jsonl") <(strip_timing "$work/r1/log.jsonl")

# ReLUfication on the GPU: a dense SiLU model with an untied head, then its weights with ReLU and a lambda
# ramped up (--ffn auto: layers turn sparse as they sparsify); L0 falls, the loss stays finite, a
# resume in the middle of the ramp repeats the run bit for bit, and --recompute changes nothing there
shape=(--layers 2 --dim 128 --heads 4 --kv-heads 2 --hidden 256)
run=(-b 8 -t 128 -u 10 -l 3e-3 -s 0 -m 4 --final-val-batches 4 -v 0)
./train_gpt_sparse "${shape[@]}" "${run[@]}" --activation silu --untied-head 1 -x 60 -n 0 -o "$work/silu" > "$work/silu.txt" 2>&1
check "GPU: a dense SiLU run with an untied head exits 0" test $? -eq 0
# (a fixed hot rate: hot sets chosen from costs timed on the GPU would differ between two runs)
relufy=("${run[@]}" --init-from "$work/silu/model_00000060.bin" --activation relu -a 0.05 --l1-ramp 20 --hot-rate 0.05)
./train_gpt_sparse "${relufy[@]}" -x 60 -n 10 -o "$work/relu" > "$work/relu.txt" 2>&1
check "GPU: the ReLUfication run exits 0" test $? -eq 0
l0_start=$(json_field "$work/relu/log.jsonl" train l0_mean | head -n 1)
l0_end=$(json_field "$work/relu/log.jsonl" train l0_mean | tail -n 5 | awk '{s += $1} END {print s / NR}')
check "GPU: ReLUfication: L0 falls ($l0_start -> $l0_end of 256)" awk -v a="$l0_start" -v b="$l0_end" 'BEGIN {exit !(b < a / 4)}'
check "GPU: ReLUfication: every loss is finite" awk '!($1 ~ /^-?[0-9.]+(e[-+][0-9]+)?$/) {bad = 1} END {exit bad || NR != 60}' \
    <(json_field "$work/relu/log.jsonl" train loss)
mkdir -p "$work/relu_b"
cp "$work/relu/model_00000010.bin" "$work/relu/state_00000010_00000.bin" "$work/relu/log.jsonl" "$work/relu_b/"
./train_gpt_sparse "${relufy[@]}" -x 60 -n 10 -o "$work/relu_b" -y 1 > "$work/relu_b.txt" 2>&1
check "GPU: ReLUfication resumed at step 10 of the ramp: the same log" \
    cmp -s <(strip_timing "$work/relu/log.jsonl") <(strip_timing "$work/relu_b/log.jsonl")
check "GPU: ReLUfication resumed: the same checkpoint" cmp -s "$work/relu/model_00000060.bin" "$work/relu_b/model_00000060.bin"
./train_gpt_sparse "${shape[@]}" "${run[@]}" --activation silu -x 8 -n 0 -o "$work/s0" > /dev/null 2>&1
./train_gpt_sparse "${shape[@]}" "${run[@]}" --activation silu -x 8 -n 0 -o "$work/s1" --recompute 1 > /dev/null 2>&1
check "SiLU: --recompute 1 gives the same steps" cmp -s <(strip_timing "$work/s0/log.jsonl") <(strip_timing "$work/s1/log.jsonl")

finish
