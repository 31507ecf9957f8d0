#!/usr/bin/env bash
# End-to-end runs of hf_convert with the other binaries: a checkpoint that train_gpt_sparse wrote goes
# to Hugging Face's format and back bit for bit (F32, and BF16 back to the same file); infer with the
# converted checkpoint and its tokenizer.json gives the same text and the same logits as with the
# original and the rank file; infer --dump-logits writes one id and V logits per sampled token;
# --encode agrees between the two tokenizer files; bad input is a one-line error. Needs
# ./train_gpt_sparse, ./infer and ./hf_convert (make).
set -u
cd "$(dirname "$0")/.." || exit 1
TEST_NAME=hf_convert_e2e
. test/check.sh
params() { tail -c +1025 "$1"; } # a model file without its header (the step differs)

# a tiny model, three steps on the CPU (GQA: 4 heads, 2 kv heads)
./train_gpt_sparse --layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 128 -t 64 -b 2 -x 3 -v 0 --final-val-batches 2 -s 0 -n 3 \
    --device cpu -o "$work/run" > "$work/train.txt" 2>&1
check "tiny training run exits 0" test $? -eq 0
model="$work/run/model_00000003.bin"

# ours -> HF -> ours, bit for bit
./hf_convert --export "$model" -o "$work/hf" > "$work/export.txt" 2>&1
check "export exits 0" test $? -eq 0
params_of() { sed -n 's/.* \([0-9.]*\)M parameters$/\1/p' "$1" | head -n 1; }
check "export counts the parameters as the trainer does ($(params_of "$work/export.txt")M)" \
    test -n "$(params_of "$work/export.txt")" -a "$(params_of "$work/export.txt")" = "$(params_of "$work/train.txt")"
./hf_convert --export "$work/run" -o "$work/hf_dir" > "$work/export_dir.txt" 2>&1
check "--export DIR exports its newest checkpoint" grep -q "^model: $model (step 3)" "$work/export_dir.txt"
expect_error "--export $work/hf: the directory holds no checkpoint (model_<step>.bin)" ./hf_convert --export "$work/hf" -o "$work/x"
expect_error "$work/train.txt exists and is not a directory" ./hf_convert --export "$model" -o "$work/train.txt"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    check "export writes $f" test -s "$work/hf/$f"
done
./hf_convert --import "$work/hf" -o "$work/back" > "$work/import.txt" 2>&1
check "import exits 0" test $? -eq 0
check "import counts the parameters as the trainer does" test "$(params_of "$work/import.txt")" = "$(params_of "$work/train.txt")"
check "import reports the tokenizer" grep -q "tokenizer: 50257 tokens" "$work/import.txt"
check "ours -> HF -> ours gives the same parameters" cmp -s <(params "$model") <(params "$work/back/model.bin")
check "no temporary files left" test -z "$(find "$work/hf" "$work/back" -name '*.tmp')"

# BF16: HF -> ours -> HF gives the same file
./hf_convert --export "$model" --dtype bf16 -o "$work/hf16" > /dev/null 2>&1
./hf_convert --import "$work/hf16" -o "$work/back16" > /dev/null 2>&1
./hf_convert --export "$work/back16/model.bin" --tokenizer "$work/back16/tokenizer.json" --dtype bf16 -o "$work/hf16b" > /dev/null 2>&1
check "BF16: HF -> ours -> HF gives the same safetensors" cmp -s "$work/hf16/model.safetensors" "$work/hf16b/model.safetensors"
check "BF16: the tokenizer.json is copied" cmp -s "$work/hf16/tokenizer.json" "$work/hf16b/tokenizer.json"

# infer: the converted checkpoint with its tokenizer.json generates what the original does
prompt="It is a truth universally acknowledged, that 12 men"
./infer -m "$model" -p "$prompt" -t 0 -n 12 -q 1 --dump-logits "$work/a.logits" > "$work/a.txt" 2>&1
check "infer with the rank file exits 0" test $? -eq 0
./infer -m "$work/back/model.bin" --tokenizer "$work/back/tokenizer.json" -p "$prompt" -t 0 -n 12 -q 1 \
    --dump-logits "$work/b.logits" > "$work/b.txt" 2>&1
check "infer with tokenizer.json exits 0" test $? -eq 0
check "the same text" cmp -s "$work/a.txt" "$work/b.txt"
check "the same logits, bit for bit" cmp -s "$work/a.logits" "$work/b.logits"
record=$((4 + 4 * 50257))
size=$(stat -c %s "$work/a.logits")
check "--dump-logits: whole records of an id and 50257 logits ($size bytes)" \
    test $((size % record)) -eq 0 -a $((size / record)) -ge 1 -a $((size / record)) -le 12
first_id=$(od -An -td4 -N4 "$work/a.logits" | tr -d ' ')
check "--dump-logits: the first id is a token ($first_id)" test "$first_id" -ge 0 -a "$first_id" -lt 50257

# --encode: the rank file and the tokenizer.json written from it agree
ids1=$(./hf_convert --encode "$prompt")
ids2=$(./hf_convert --tokenizer "$work/hf/tokenizer.json" --encode "$prompt")
check "--encode agrees ($ids1)" test -n "$ids1" -a "$ids1" = "$ids2"

# errors
expect_error "no config.json (not a Hugging Face checkpoint directory?)" ./hf_convert --import "$work/run" -o "$work/x"
expect_error "give exactly one of --import, --export and --encode" ./hf_convert -o "$work/x"
printf '{"model": {"type": "Unigram"}}' > "$work/bad.json"
expect_error "model.type is Unigram: only byte-level BPE is supported" ./infer -m "$model" --tokenizer "$work/bad.json" -p hi
expect_error "--dump-logits writes the logits of generation: drop --analyze" ./infer -m "$model" --analyze "x" --dump-logits "$work/y"
sed 's/"hidden_act": "relu"/"hidden_act": "gelu"/' "$work/hf/config.json" > "$work/cfg" && mv "$work/cfg" "$work/hf/config.json"
expect_error "hidden_act gelu is not supported: the FFN's gate is relu or silu" ./hf_convert --import "$work/hf" -o "$work/x"

finish
