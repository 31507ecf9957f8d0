#!/usr/bin/env bash
# Sparsifying a dense SiLU model (ReLUfication), end to end on the CPU path with a tiny model: a dense
# SiLU model with an untied head trains from scratch (lambda 0 by itself), goes to Hugging Face's
# format and back bit for bit (hidden_act silu, tie_word_embeddings false), and infer generates from
# it the same logits either way; --init-from then starts a ReLU run from its weights (step 0, a fresh
# optimizer) whose lambda ramps from 0 as a function of the step: the loss stays finite, the L0 falls
# and units die, a resume in the middle of the ramp repeats the run bit for bit, and the dead-neuron
# re-initialisation still runs. Flags that cannot go together are one-line errors.
set -u
cd "$(dirname "$0")/.." || exit 1
TEST_NAME=relufy
. test/check.sh
params() { tail -c +1025 "$1"; } # a model file without its header

shape=(--layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 256)
run=(-t 64 -b 4 -u 5 -l 3e-3 -s 0 -m 4 --final-val-batches 4 -v 0)

# 1. a dense SiLU model with an untied head, from scratch
./train_gpt_sparse "${shape[@]}" "${run[@]}" --activation silu --untied-head 1 -x 40 -n 40 -o "$work/silu" \
    > "$work/silu.txt" 2>&1
check "the SiLU run exits 0" test $? -eq 0
check "the SiLU run says its FFN and head" grep -q "SiLU FFN, untied head" "$work/silu.txt"
check "a SiLU run has lambda 0 unless told" grep -q "lambda 0 | lr" "$work/silu.txt"
check "the SiLU run is dense" grep -q "^ffn: dense$" "$work/silu.txt"
first=$(json_field "$work/silu/log.jsonl" train ce | head -n 1)
silu_ce=$(json_field "$work/silu/log.jsonl" train ce | tail -n 5 | awk '{s += $1} END {print s / NR}')
check "the SiLU run learns ($first -> $silu_ce)" awk -v a="$first" -v b="$silu_ce" 'BEGIN {exit !(b < a - 1.0)}'
silu="$work/silu/model_00000040.bin"

# 2. to Hugging Face's format and back; infer gives the same logits from both
./hf_convert --export "$silu" -o "$work/hf" > "$work/export.txt" 2>&1
check "export exits 0" test $? -eq 0
check "export: hidden_act silu" grep -q '"hidden_act": "silu"' "$work/hf/config.json"
check "export: an untied head" grep -q '"tie_word_embeddings": false' "$work/hf/config.json"
./hf_convert --import "$work/hf" -o "$work/back" > "$work/import.txt" 2>&1
check "import exits 0" test $? -eq 0
check "import says silu and untied" grep -q "hidden_act silu" "$work/import.txt"
check "ours -> HF -> ours gives the same parameters (lm_head too)" cmp -s <(params "$silu") <(params "$work/back/model.bin")
./infer -m "$silu" -p "The sea" -n 8 -t 0 -q 1 --dump-logits "$work/a.logits" > "$work/a.txt" 2>&1
check "infer on the SiLU model exits 0" test $? -eq 0
./infer -m "$work/back/model.bin" --tokenizer "$work/back/tokenizer.json" -p "The sea" -n 8 -t 0 -q 1 \
    --dump-logits "$work/b.logits" > "$work/b.txt" 2>&1
check "infer on the converted SiLU model: the same logits, bit for bit" cmp -s "$work/a.logits" "$work/b.logits"

# 3. ReLUfication: the SiLU model's weights, ReLU, lambda ramped up over 10 steps
relufy=("${run[@]}" --init-from "$work/back/model.bin" --activation relu -a 0.05 --l1-ramp 10)
./train_gpt_sparse "${relufy[@]}" -x 30 -n 10 -o "$work/relu" > "$work/relu.txt" 2>&1
check "the ReLUfication run exits 0" test $? -eq 0
check "it says where its weights come from" grep -q "^init: the weights of $work/back/model.bin (step 0 of the run that wrote it), a fresh optimizer from step 0$" "$work/relu.txt"
check "it says the activation changes" grep -q "^init: the FFN activation silu of the checkpoint becomes relu$" "$work/relu.txt"
check "it announces the ramp" grep -q "lambda 0.05 (ramped up from lambda / 10 over 10 steps)" "$work/relu.txt"
check "the step lines show lambda" grep -qE '^step +5/30 .*\| lambda 2\.50e-02 \|' "$work/relu.txt"
check "lambda ramps as 0.05 step / 10, then stays (float32)" awk '{d = $1 - (NR <= 10 ? 0.005 * NR : 0.05)}
    d > 1e-8 || d < -1e-8 {bad = 1} END {exit bad || NR != 30}' <(json_field "$work/relu/log.jsonl" train lambda)
check "every loss is finite" awk '!($1 ~ /^-?[0-9.]+(e[-+][0-9]+)?$/) {bad = 1} END {exit bad || NR != 30}' \
    <(json_field "$work/relu/log.jsonl" train loss)
relu_ce=$(json_field "$work/relu/log.jsonl" train ce | head -n 1)
check "it starts from the SiLU model, not a random one (CE $relu_ce, SiLU $silu_ce, random $first)" \
    awk -v a="$relu_ce" -v r="$first" 'BEGIN {exit !(a < r - 1.0)}'
l0_start=$(json_field "$work/relu/log.jsonl" train l0_mean | head -n 1)
l0_end=$(json_field "$work/relu/log.jsonl" train l0_mean | tail -n 3 | awk '{s += $1} END {print s / NR}')
check "L0 falls ($l0_start -> $l0_end of 256)" awk -v a="$l0_start" -v b="$l0_end" 'BEGIN {exit !(b < a / 4)}'
check "the log has dead units" grep -q '"dead":[0-9.e+-]*,"lr"' "$work/relu/log.jsonl"

# 4. resumed in the middle of the ramp: the same log and checkpoint as the run that never stopped
# (a checkpoint at step 5 of the 10-step ramp, from a run told to stop there: -x 10, whose lr schedule
# --lr-schedule new replaces by the -x 30 one)
./train_gpt_sparse "${relufy[@]}" -x 10 -n 5 -o "$work/relu_c" > /dev/null 2>&1
mkdir -p "$work/relu_d"
cp "$work/relu_c/model_00000005.bin" "$work/relu_c/state_00000005_00000.bin" "$work/relu_c/log.jsonl" "$work/relu_d/"
./train_gpt_sparse "${relufy[@]}" -x 30 -n 10 -o "$work/relu_d" -y 1 --lr-schedule new > "$work/relu_d.txt" 2>&1
check "a resume at step 5 of the ramp exits 0" test $? -eq 0
check "resumed at step 5: the same log as the uninterrupted run" \
    cmp -s <(strip_timing "$work/relu/log.jsonl") <(strip_timing "$work/relu_d/log.jsonl")
check "resumed at step 5: the same final checkpoint" cmp -s "$work/relu/model_00000030.bin" "$work/relu_d/model_00000030.bin"

# 5. the dead-neuron re-initialisation during a ReLUfication
./train_gpt_sparse "${relufy[@]}" -x 6 -n 0 --dead-reinit 1 -o "$work/reinit" > "$work/reinit.txt" 2>&1
check "--dead-reinit 1 with --init-from exits 0" test $? -eq 0

# 6. what does not go together
expect_error "--init-from takes the model's shape from $silu: drop --dim" ./train_gpt_sparse --init-from "$silu" --dim 64 -o "$work/x"
expect_error "--init-from takes the model's shape from $silu: drop --untied-head" ./train_gpt_sparse --init-from "$silu" --untied-head 0 -o "$work/x"
expect_error "the L1 term needs ReLU: a SiLU model (--activation silu) trains with -a 0 and no --l1-ramp" \
    ./train_gpt_sparse "${shape[@]}" --activation silu -a 0.01 -o "$work/x"
expect_error "the L1 term needs ReLU: a SiLU model (--activation silu, from --init-from) trains with -a 0" \
    ./train_gpt_sparse --init-from "$silu" -a 0.01 -o "$work/x"
expect_error "--ffn sparse needs ReLU: a SiLU model trains dense" ./train_gpt_sparse "${shape[@]}" --activation silu --ffn sparse -o "$work/x"
expect_error "--dead-reinit 1 needs ReLU" ./train_gpt_sparse "${shape[@]}" --activation silu --dead-reinit 1 -o "$work/x"
expect_error "--activation must be relu or silu, not 'gelu'" ./train_gpt_sparse --activation gelu -o "$work/x"
expect_error "--l1-ramp 5 ramps lambda up to -a, which is 0" ./train_gpt_sparse "${shape[@]}" --l1-ramp 5 -a 0 -o "$work/x"
expect_error "--synthetic-sparse and --init-from are two inits" ./train_gpt_sparse --init-from "$silu" --synthetic-sparse 4 -n -1 -o "$work/x"
expect_error "cannot open $work/none.bin" ./train_gpt_sparse --init-from "$work/none.bin" -o "$work/x"
expect_error "is for another model: activation (0 relu, 1 silu) 0 (checkpoint) vs 1 (this run)" \
    ./train_gpt_sparse "${run[@]}" --init-from "$work/back/model.bin" --activation silu -a 0 \
    -x 40 -o "$work/relu" -y 1

# 7. the experiment script (dev/relufy_experiment.sh) goes through on a tiny model on the CPU
plot=--no-plot
command -v gnuplot > /dev/null 2>&1 && plot=""
dev/relufy_experiment.sh --device cpu --shape "${shape[*]}" --batch 2 --seq-len 32 --steps 4 --lambda 0.05 $plot \
    -o "$work/experiment" > "$work/experiment.txt" 2>&1
check "the experiment script exits 0" test $? -eq 0
check "the experiment script prints its table" grep -q "^| (b) (a) ReLUfied + L1 (lambda 0.05, ramp 1) | 1 |" "$work/experiment.txt"
check "the experiment script writes its CSV" test "$(wc -l < "$work/experiment/results.csv")" -eq 4
if [ -z "$plot" ]; then check "the experiment script plots" test -s "$work/experiment/relufy.png"; fi
cp "$work/experiment/results.csv" "$work/results_trained.csv"
dev/relufy_experiment.sh --device cpu --shape "${shape[*]}" --batch 2 --seq-len 32 --steps 4 --lambda 0.05 $plot \
    --report-only -o "$work/experiment" > "$work/report.txt" 2>&1
check "--report-only exits 0" test $? -eq 0
check "--report-only trains nothing and gives the same table" cmp -s "$work/results_trained.csv" "$work/experiment/results.csv"
check "--report-only prints no training run" bash -c "! grep -q '^(a) ' '$work/report.txt'"
expect_error "error: --steps 2: a whole number of at least 4" dev/relufy_experiment.sh --steps 2 --no-plot -o "$work/x"

finish
