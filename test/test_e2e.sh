#!/usr/bin/env bash
# End-to-end runs of train_gpt_sparse and infer on the CPU path, on the corpus
# in data/: the loss falls, a resumed run repeats the uninterrupted one bit for
# bit, bad input gets a one-line error, and infer generates from the checkpoint.
set -u
cd "$(dirname "$0")/.."
TEST_NAME=e2e
. test/check.sh

# a tiny model: 2 layers, D 64, GQA with 2 kv heads; 64-token sequences
tiny=(--layers 2 --dim 64 --heads 4 --kv-heads 2 -t 64 -u 5 -l 3e-3 -s 0 -m 4 --final-val-batches 4)
train() { ./train_gpt_sparse "${tiny[@]}" --hidden 128 "$@"; }       # micro-batch 4 unless -b is given

# 1. training: the loss falls and validation improves
train -o "$work/a" -x 40 -v 20 -n 20 -b 4 > "$work/a.txt" 2>&1
check "training run exits 0" test $? -eq 0
check "CPU path is announced" grep -q "device: CPU reference path" "$work/a.txt"
first=$(json_field "$work/a/log.jsonl" train loss | head -n 1)
last=$(json_field "$work/a/log.jsonl" train loss | tail -n 5 | awk '{s += $1} END {print s / NR}')
check "train loss falls ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a - 1.0)}'
val0=$(json_field "$work/a/log.jsonl" val val_ce | head -n 1)
val1=$(json_field "$work/a/log.jsonl" val val_ce | tail -n 1)
check "val CE falls ($val0 -> $val1)" awk -v a="$val0" -v b="$val1" 'BEGIN {exit !(b < a - 1.0)}'
check "log has per-layer statistics" grep -q '"layers":{"l0_mean":\[[0-9.e+-]*,[0-9.e+-]*\]' "$work/a/log.jsonl"
check "no temporary files left" test -z "$(ls "$work/a" | grep tmp)"

# 2. resume: stop at step 20, continue, and get the same log as the uninterrupted run
mkdir -p "$work/b"
cp "$work/a/model_00000020.bin" "$work/a/state_00000020_00000.bin" "$work/b/"
# the log of a run that went past its last checkpoint before it died: what follows step 20 is redone
cp "$work/a/log.jsonl" "$work/b/log.jsonl"
echo '{"type":"train","step":41,"loss":0}' >> "$work/b/log.jsonl"
train -o "$work/b" -x 40 -v 20 -n 20 -b 4 -y 1 > "$work/b.txt" 2>&1
check "resumed run exits 0" test $? -eq 0
check "resumed run says so" grep -q "resumed from .*model_00000020.bin at step 20" "$work/b.txt"
check "resumed log is identical to the uninterrupted one" cmp -s <(strip_timing "$work/a/log.jsonl") <(strip_timing "$work/b/log.jsonl")
check "resumed checkpoint is identical" cmp -s "$work/a/model_00000040.bin" "$work/b/model_00000040.bin"

# 2a. with --ffn auto, layers that turned sparse before the checkpoint are sparse
# in the resumed run too (the choices are in the state file): still bit for bit
auto=("${tiny[@]}" --hidden 512 -x 40 -v 0 -n 20 -b 4 -a 0.05 --ffn auto)
./train_gpt_sparse "${auto[@]}" -o "$work/auto" > "$work/auto.txt" 2>&1
check "auto FFN run exits 0" test $? -eq 0
check "auto turns a layer sparse before the checkpoint" awk '/^step +[0-9]+\// {n = $2 + 0} /-> sparse/ && n < 20 {e = 1} END {exit !e}' "$work/auto.txt"
mkdir -p "$work/auto_b"
cp "$work/auto/model_00000020.bin" "$work/auto/state_00000020_00000.bin" "$work/auto/log.jsonl" "$work/auto_b/"
./train_gpt_sparse "${auto[@]}" -o "$work/auto_b" -y 1 > "$work/auto_b.txt" 2>&1
check "auto FFN resumed log is identical" cmp -s <(strip_timing "$work/auto/log.jsonl") <(strip_timing "$work/auto_b/log.jsonl")

# 2b. gradient accumulation: 2 micro-batches of 2 sequences make the same steps as 1 of 4
train -o "$work/acc1" -x 6 -v 0 -n 0 -b 4 > /dev/null 2>&1
train -o "$work/acc2" -x 6 -v 0 -n 0 -b 2 -d 256 > "$work/acc2.txt" 2>&1
check "accumulation is announced" grep -q "2 x 64 tokens x 2 accumulation = 256 tokens per step" "$work/acc2.txt"
check "accumulated steps match the big micro-batch" awk 'NR == FNR {a[FNR] = $1; next} {n++; d = a[FNR] - $1; if (d < 0) d = -d; if (d > 1e-4 * a[FNR]) bad = 1} END {exit bad || n != 6}' \
    <(json_field "$work/acc1/log.jsonl" train loss) <(json_field "$work/acc2/log.jsonl" train loss)

# 2c. the data position in a state file (edited as a version 1 file, which has no checksum): a state at the
# end of the epoch below the bound resumes, the run goes on into the epoch at the bound, and its checkpoint
# resumes too; a state past the bound, whose run could not go on, is refused with one line naming the file
# put_le FILE OFFSET BYTES VALUE: VALUE as a BYTES-byte little-endian integer at OFFSET
put_le() {
    local i bytes=""
    for ((i = 0; i < $3; i++)); do bytes+=$(printf '\\%03o' $((($4 >> (8 * i)) & 255))); done
    printf "$bytes" | dd of="$1" bs=1 seek="$2" conv=notrunc 2> /dev/null
}
max_epoch=$((1 << 62)) # DL_MAX_EPOCH
tokens=$(od -An -tu4 -j8 -N4 data/corpus_train_000001.bin)
for dir in ep ep_past; do
    mkdir -p "$work/$dir"
    cp "$work/a/model_00000020.bin" "$work/a/state_00000020_00000.bin" "$work/$dir/"
    st="$work/$dir/state_00000020_00000.bin"
    put_le "$st" 4 4 1; put_le "$st" 1016 8 0                     # version 1, no checksum
    put_le "$st" 1032 8 $((max_epoch - 1))                          # the loader state's epoch,
    put_le "$st" 1040 8 0; put_le "$st" 1048 8 $(((tokens - 1) / 64 / 4 - 1)) # its shard and last batch
done
train -o "$work/ep" -x 23 -v 0 -n 0 -b 4 -y 1 > "$work/ep.txt" 2>&1
check "a state one epoch below the bound resumes" test $? -eq 0
check "its version 1 files are noted" grep -q "note: the optimizer state of step 20 in $work/ep is in version 1 files" "$work/ep.txt"
check "the run went on into the epoch at the bound" test "$(od -An -tu8 -j1032 -N24 "$work/ep/state_00000023_00000.bin" | xargs)" = "$max_epoch 0 2"
check "... and its checkpoint resumes" train -o "$work/ep" -x 24 -v 0 -n 0 -b 4 -y 1 > /dev/null 2>&1
put_le "$work/ep_past/state_00000020_00000.bin" 1032 8 $((max_epoch + 1))
expect_error "$work/ep_past/state_00000020_00000.bin: data loader state is corrupt: epoch $((max_epoch + 1)), expected at most $max_epoch" \
    train -o "$work/ep_past" -x 23 -v 0 -n 0 -b 4 -y 1

# 3. bad input: one clear line naming the problem
expect_error "is for another model: hidden 128 (checkpoint) vs 96 (this run)" \
    ./train_gpt_sparse "${tiny[@]}" --hidden 96 -o "$work/b" -x 50 -y 1
expect_error "holds no checkpoint (model_<step>.bin and its state files)" train -o "$work/empty" -y 1
expect_error "-b 0 is out of range" ./train_gpt_sparse -b 0
expect_error "unknown flag '--bogus'" ./train_gpt_sparse --bogus 1
expect_error "is not a multiple of batch x seq-len" train -d 1000
printf 'not a shard' > "$work/bad_train_000001.bin"
expect_error "$work/bad_train_000001.bin" train -i "$work/bad_train_*.bin" -o "$work/c"
head -c 2000 data/corpus_val_000000.bin > "$work/cut_val_000000.bin"
expect_error "$work/cut_val_000000.bin" train -j "$work/cut_val_*.bin" -o "$work/c"

# a model file shorter than its header says, the header of a 1024-layer model with H 2^20: every loader
# checks the size before it builds or allocates what the header describes
cut="$work/cut/model_00000040.bin"
mkdir -p "$work/cut"
head -c 1024 "$work/a/model_00000040.bin" > "$cut"
cp "$work/a/state_00000040_00000.bin" "$work/cut/"
put_le "$cut" 16 4 1024; put_le "$cut" 32 4 1048576 # [4] layers, [8] hidden
n=$((50304 * 64 + 1024 * (64 + 128 * 64 + 64 * 64 + 64 + 3 * 1048576 * 64) + 64)) # Vp D + L (D + qkv D + D D + D + 3 H D) + D
put_le "$cut" 52 8 $n                                                             # [13, 14] parameters
want="$cut: file is 1024 bytes, its header describes $((1024 + 4 * n)) (truncated?)"
expect_error "$want" ./train_gpt_sparse --init-from "$cut" -o "$work/x"
expect_error "$want" train -o "$work/cut" -x 50 -y 1
expect_error "$want" ./infer -m "$cut" -p hi
expect_error "$want" ./hf_convert --export "$cut" -o "$work/x_hf"

# 4. infer on the checkpoint
model="$work/a/model_00000040.bin"
./infer -m "$model" -p "The sea" -n 20 -t 0 -q 1 > "$work/g1.txt" 2>&1
check "infer greedy exits 0" test $? -eq 0
check "infer produced text" test "$(wc -c < "$work/g1.txt")" -gt 10
echo -n "The sea" > "$work/prompt.txt"
./infer -m "$model" -f "$work/prompt.txt" -n 20 -t 0 -q 1 > "$work/g2.txt" 2>&1
check "prompt from a file gives the same greedy text" cmp -s "$work/g1.txt" "$work/g2.txt"
echo -n "The sea" | ./infer -m "$model" -n 20 -t 0 -q 1 > "$work/g3.txt" 2>&1
check "prompt from stdin gives the same greedy text" cmp -s "$work/g1.txt" "$work/g3.txt"
echo "The sea" | ./infer -m "$model" -n 20 -t 0 -q 1 > "$work/g4.txt" 2>&1
check "the line end after a prompt on stdin is not part of it" cmp -s "$work/g1.txt" "$work/g4.txt"
./infer -m "$model" -p "The sea" -n 5 -t 0 > "$work/both.txt" 2>&1
check "the statistics line is a line of its own after the text" grep -q "^prompt [0-9]* tokens in " "$work/both.txt"
out=$(./infer -m "$work/nothing.bin" -p hi 2>&1)
check "an error names the file and what failed, no source location" test "$out" = "error: cannot open $work/nothing.bin: No such file or directory"
check "infer --help shows -m's default" bash -c './infer --help | grep -qE "^  -m, --model .* \[out\]$"'
check "train_gpt_sparse --help: --l1-ramp starts from lambda / R" bash -c './train_gpt_sparse --help | grep -q -- "--l1-ramp .*from -a / R at step 1 to -a at step R"'
out=$(./train_gpt_sparse --lr=-1 2>&1)
check "a value given with = is named once in an error" test "$out" = "error: --lr -1 is out of range [0, 10]"
./infer -m "$model" -p "It was" -n 30 -t 0.9 -k 40 --top-p 0.95 -s 7 > "$work/s1.txt" 2>/dev/null
./infer -m "$model" -p "It was" -n 30 -t 0.9 -k 40 --top-p 0.95 -s 7 > "$work/s2.txt" 2>/dev/null
check "sampling is reproducible for a seed" cmp -s "$work/s1.txt" "$work/s2.txt"
./infer -m "$model" -p "x" -n 100000 -t 0 > /dev/null 2> "$work/long.txt"
check "generation stops at max_seq_len or end of text" grep -qE "stopped at (max_seq_len|end of text)" "$work/long.txt"
printf 'bad \xff byte' > "$work/bad_prompt.txt"
expect_error "not valid UTF-8 at byte 4" ./infer -m "$model" -f "$work/bad_prompt.txt"
expect_error "bad magic" ./infer -m "$work/a/state_00000040_00000.bin" -p hi
expect_error "cannot open" ./infer -m "$work/nothing.bin" -p hi
cp "$model" "$work/nan.bin" # a NaN in token 0's embedding (tied: its logit too)
printf '\x00\x00\xc0\x7f' | dd of="$work/nan.bin" bs=1 seek=1024 conv=notrunc 2> /dev/null
expect_error "nan.bin: checksum mismatch" ./infer -m "$work/nan.bin" -p "The sea" -n 5 --device cpu -q 1
# the same as a version 1 file (no checksum): the loader finds the NaN
printf '\x01\x00\x00\x00' | dd of="$work/nan.bin" bs=1 seek=4 conv=notrunc 2> /dev/null
head -c 8 /dev/zero | dd of="$work/nan.bin" bs=1 seek=1016 conv=notrunc 2> /dev/null
expect_error "nan.bin: wte[0] is NaN: a checkpoint's parameters must all be finite" ./infer -m "$work/nan.bin" -p "The sea" -n 5 --device cpu -q 1
mkdir -p "$work/empty_dir"
expect_error "the directory holds no checkpoint" ./infer -m "$work/empty_dir" -p hi
printf 'The sea\n\nIt was\n' > "$work/prompts.txt"
./infer -m "$model" -f "$work/prompts.txt" -n 10 -t 0 -q 1 > "$work/batch.txt" 2>&1
{ printf '[1] '; ./infer -m "$model" -p "The sea" -n 10 -t 0 -q 1; printf '[2] '; ./infer -m "$model" -p "It was" -n 10 -t 0 -q 1; } > "$work/batch_expect.txt" 2>&1
check "a prompt file is a batch: each line as it would come alone" cmp -s "$work/batch.txt" "$work/batch_expect.txt"
printf 'fine\nbad \xff byte\n' > "$work/bad_line.txt"
expect_error "line 2) is not valid UTF-8 at byte 4" ./infer -m "$model" -f "$work/bad_line.txt"
expect_error "--ffn chooses a GPU path" ./infer -m "$model" -p hi --device cpu --ffn dense
expect_error "--device gpu: expected auto, cpu or cuda" ./infer -m "$model" -p hi --device gpu

# 5. tokenize: text files into llm.c shards, documents split across shard boundaries as llm.c does
printf 'Hello world' > "$work/doc1.txt"; printf 'Hello world' > "$work/doc2.txt"
./tokenize -o "$work/tok" -s 4 "$work/doc1.txt" "$work/doc2.txt" > /dev/null 2>&1
shard_tokens() { od -An -v -tu2 -j1024 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
check "tokenize: val shard holds <eot> Hello world <eot>" test "$(shard_tokens "$work/tok_val_000000.bin")" = "50256 15496 995 50256"
check "tokenize: train shard holds the rest" test "$(shard_tokens "$work/tok_train_000001.bin")" = "15496 995"
check "tokenize: header magic, version and count" test "$(od -An -tu4 -N12 "$work/tok_train_000001.bin" | tr -s ' ')" = " 20240520 1 2"
printf 'bad \xc3\x28' > "$work/bad_doc.txt"
expect_error "bad_doc.txt" ./tokenize -o "$work/tok2" "$work/bad_doc.txt"

# 6. the default command's model and data, for one step
./train_gpt_sparse -x 1 -m 1 --final-val-batches 1 -o "$work/default" > "$work/default.txt" 2>&1
check "the default model trains a step" grep -q "step     1/1" "$work/default.txt"

finish
