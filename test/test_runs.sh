#!/usr/bin/env bash
# What a training run does with its output directory, and with steps that go
# wrong, on the CPU path (a tiny model): a new run never mixes with another
# (refused, or --overwrite 1 deletes it, or --resume 1 continues it, said in one
# line); a resume with nothing left to do or a state file of another step is an
# error; a step with a NaN gradient is skipped with the weights unchanged, too
# many in a row stop the run, and no checkpoint ever holds a NaN. A damaged or
# missing newest checkpoint is an error that says how to continue from the one
# before it (--resume-step); a resume with another -x keeps the lr schedule or,
# with --lr-schedule new, takes the run's, said in one line. Each validation says
# how many tokens it covered, the last one the whole val set. First contact: the
# default run on the CPU is a short one that says so, every step line has an
# ETA, a long validation shows its progress, infer finds the newest checkpoint,
# and the binaries find their default data from any directory.
set -u
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
set -m # job control: background runs get SIGTERM's default
TEST_NAME=runs
. test/check.sh

tiny=(--layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 128 -t 32 -b 2 -u 5 -l 3e-3 -s 0 -m 2 --final-val-batches 2)
train() { ./train_gpt_sparse "${tiny[@]}" "$@"; }
greedy() { ./infer -m "$1" -p "The sea" -n 12 -t 0 -q 1 --device cpu 2>&1; }

# 1. a new run says so, and each step line has an ETA
train -x 20 -v 10 -n 10 -o "$work/a" > "$work/a.txt" 2>&1
check "a run exits 0" test $? -eq 0
check "a new run says so" grep -q "^output: $work/a, a new run$" "$work/a.txt"
check "every step line has an ETA" test "$(grep -cE '^step +[0-9]+/20 .*\| ETA [0-9]+(s|m[0-9]{2}s|h[0-9]{2}m)$' "$work/a.txt")" -eq 20

# 2. the output directory: refused, started over, or continued; never mixed
cp "$work/a/log.jsonl" "$work/a_log"
expect_error "$work/a holds another run (5 checkpoint and log files; the newest complete checkpoint is $work/a/model_00000020.bin): give --resume 1 to continue it, --overwrite 1 to delete it and start over" \
    train -x 20 -o "$work/a"
check "a refused run leaves the other's log alone" cmp -s "$work/a_log" "$work/a/log.jsonl"
cp -r "$work/a" "$work/over"
train -x 4 -v 0 -n 2 -o "$work/over" --overwrite 1 > "$work/over.txt" 2>&1
check "--overwrite 1 starts over" test $? -eq 0
check "--overwrite 1 says what it deleted" grep -q "^output: $work/over, a new run (--overwrite 1: deleted the 5 checkpoint and log files of the run there)$" "$work/over.txt"
check "--overwrite 1: no file of the old run is left" test ! -e "$work/over/model_00000010.bin" -a ! -e "$work/over/state_00000020_00000.bin"
check "--overwrite 1: the log is the new run's" test "$(grep -c '"type":"train"' "$work/over/log.jsonl")" -eq 4
expect_error "--resume 1 continues the run in the output dir, --overwrite 1 deletes it: give one" train -x 30 -o "$work/a" -y 1 --overwrite 1
expect_error "the newest checkpoint in $work/a is step 20, past -x 10: give a larger -x to train on" train -x 10 -o "$work/a" -y 1
expect_error "the run in $work/a already reached step 20 = -x: nothing to train" train -x 20 -o "$work/a" -y 1
mkdir -p "$work/mixed" "$work/renamed"
cp "$work/a/model_00000020.bin" "$work/mixed/model_00000020.bin"
cp "$work/a/state_00000010_00000.bin" "$work/mixed/state_00000020_00000.bin"
expect_error "$work/mixed/state_00000020_00000.bin holds step 10, but its model file is step 20: they are not one checkpoint" \
    train -x 30 -o "$work/mixed" -y 1
cp "$work/a/model_00000010.bin" "$work/renamed/model_00000020.bin"
cp "$work/a/state_00000020_00000.bin" "$work/renamed/state_00000020_00000.bin"
expect_error "$work/renamed/model_00000020.bin holds step 10, not the 20 of its name" train -x 30 -o "$work/renamed" -y 1
cp -r "$work/a" "$work/a20"
train -x 24 -v 0 -n 0 -o "$work/a" -y 1 > "$work/a2.txt" 2>&1
check "--resume 1 continues and says so in one line" grep -q "^resumed from $work/a/model_00000020.bin at step 20 (of 24)$" "$work/a2.txt"
lr_of() { json_field "$1/log.jsonl" train lr | sed -n "$2p"; } # lr_of DIR STEP
# another -x: the checkpoint's lr schedule is kept (steps past its end at the floor), said in one line; or
# with --lr-schedule new this run's
check "a resume with another -x keeps the lr schedule and says so" grep -q "^lr schedule: the checkpoint's (peak 0.003 after 5 warmup steps, cosine to 0.0003 at step 20), not this run's (peak 0.003 after 5 warmup steps, cosine to 0.0003 at step 24): step 21 at lr 3.00e-04 (--lr-schedule new: 5.85e-04)$" "$work/a2.txt"
check "... and trains at the floor past the checkpoint's last step ($(lr_of "$work/a" 21))" awk -v x="$(lr_of "$work/a" 21)" 'BEGIN {exit !(x > 2.99e-4 && x < 3.01e-4)}'
cp -r "$work/a20" "$work/new"
train -x 24 -v 0 -n 0 -o "$work/new" -y 1 --lr-schedule new > "$work/new.txt" 2>&1
check "--lr-schedule new takes this run's and says so" grep -q "^lr schedule: this run's (peak 0.003 after 5 warmup steps, cosine to 0.0003 at step 24), not the checkpoint's (.*at step 20) (--lr-schedule new): step 21 at lr 5.85e-04 instead of 3.00e-04$" "$work/new.txt"
check "... and trains by it ($(lr_of "$work/new" 21))" awk -v x="$(lr_of "$work/new" 21)" 'BEGIN {exit !(x > 5.84e-4 && x < 5.85e-4)}'
expect_error "--lr-schedule must be keep or new, not 'old'" train -x 24 -o "$work/new" -y 1 --lr-schedule old

# 2b. a newest checkpoint that is incomplete or damaged: an error naming it, and the flag that continues from
# the one before it; never a silent step back to it
cp -r "$work/a" "$work/lost"
rm "$work/lost/state_00000024_00000.bin"
expect_error "the newest checkpoint in $work/lost, step 24, is incomplete: $work/lost/state_00000024_00000.bin is missing; --resume-step 20 continues from the complete checkpoint before it (and deletes the files of the later steps)" \
    train -x 30 -o "$work/lost" -y 1
cp -r "$work/a" "$work/cut"
truncate -s 2000 "$work/cut/state_00000024_00000.bin"
expect_error "$work/cut/state_00000024_00000.bin: file is 2000 bytes, its header describes" train -x 30 -o "$work/cut" -y 1
expect_error "(truncated?); --resume-step 20 continues from the complete checkpoint before it" train -x 30 -o "$work/cut" -y 1
cp "$work/a/state_00000024_00000.bin" "$work/cut/"
printf '\x01' | dd of="$work/cut/model_00000024.bin" bs=1 seek=5000 conv=notrunc 2> /dev/null
expect_error "$work/cut/model_00000024.bin: checksum mismatch (header " train -x 30 -o "$work/cut" -y 1
expect_error "--resume-step 25: the checkpoint is incomplete: $work/cut/model_00000025.bin is missing" train -x 30 -o "$work/cut" --resume-step 25
train -x 24 -v 0 -n 0 -o "$work/lost" --resume-step 20 > "$work/lost.txt" 2>&1
check "--resume-step 20 continues from step 20" grep -q "^resumed from $work/lost/model_00000020.bin at step 20 (of 24)$" "$work/lost.txt"
check "... and says that it deleted the later checkpoint's file" grep -q "^--resume-step 20: deleted 1 file of later checkpoints$" "$work/lost.txt"
check "... to the same log as the run that was not damaged" cmp -s <(strip_timing "$work/a/log.jsonl") <(strip_timing "$work/lost/log.jsonl")
check "... and the same checkpoint" cmp -s "$work/a/model_00000024.bin" "$work/lost/model_00000024.bin"
rm -r "$work/a20" "$work/new" "$work/lost" "$work/cut"

# 2c. each validation says how many tokens it covered; the last covers the whole val set (a val shard of 300
# tokens: 4 batches of 2 x 32)
./tokenize -o "$work/small" -s 300 README.md > /dev/null 2>&1
./train_gpt_sparse --layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 128 -t 32 -b 2 -s 0 -m 1 -x 2 -v 1 -n 0 \
    -j "$work/small_val_*.bin" -o "$work/val" > "$work/val.txt" 2>&1
check "a validation says its tokens" grep -qE "^step 1 \| val ce [0-9.]+ on 64 tokens \(1 of the val set's 4 batches\)$" "$work/val.txt"
check "the last covers the whole val set" grep -qE "^step 2 \| val ce [0-9.]+ on 256 tokens \(the whole val set: 4 batches\)$" "$work/val.txt"
check "the log has the tokens too" grep -q '^{"type":"val","step":2,"val_ce":[0-9.]*,"tokens":256}$' "$work/val/log.jsonl"
: > "$work/a_file"
expect_error "$work/a_file exists and is not a directory" train -o "$work/a_file"

# 3. a NaN gradient at step 5: the step is skipped and logged, the weights are those of step 4 (the lr of
# the warmup steps does not depend on -x), and the run goes on
train -x 4 -v 0 -n 0 -o "$work/four" > /dev/null 2>&1
train -x 5 -v 0 -n 0 -o "$work/skip" --inject-nan gradient:5 > "$work/skip.txt" 2>&1
check "a run with one NaN step exits 0" test $? -eq 0
check "the skipped step is said" grep -q "^step     5/5 | loss [0-9.]* | norm nan | skipped: not finite, weights and moments unchanged (1 in a row; the run stops after 5)$" "$work/skip.txt"
check "the skipped step is logged with null for NaN" grep -q '^{"type":"skip","step":5,"loss":[0-9.e+-]*,"grad_norm":null}$' "$work/skip/log.jsonl"
check "no NaN in the JSON log" bash -c '! grep -qi nan "$0"' "$work/skip/log.jsonl"
check "the skipped step left the weights of step 4" test "$(greedy "$work/skip/model_00000005.bin")" = "$(greedy "$work/four/model_00000004.bin")"
# a NaN moment at step 3 makes the weights NaN: no checkpoint is written, the run stops with an error
out=$(train -x 10 -v 0 -n 2 -o "$work/nanckpt" --inject-nan moment:3 2>&1 > /dev/null)
check "a NaN in the weights: no checkpoint, an error" \
    bash -c '[[ "$0" == "error: step 4: the weights hold a non-finite value (nan at index 0): no checkpoint written; the newest complete checkpoint is $1/model_00000002.bin" ]]' \
    "$out" "$work/nanckpt"
check "... and only the good checkpoint exists" test "$(ls "$work/nanckpt" | grep -c '^model_')" -eq 1
out=$(train -x 10 -v 0 -n 0 -o "$work/nanstop" --inject-nan moment:3 --max-nonfinite 2 2>&1 > /dev/null)
check "--max-nonfinite 2: two non-finite steps in a row stop the run with an error" \
    bash -c '[[ "$0" == "error: steps 4 to 5: the loss or gradient norm was not finite 2 times in a row (--max-nonfinite 2), stopping; $1 holds no complete checkpoint"* ]]' \
    "$out" "$work/nanstop"
check "... after logging both" test "$(grep -c '"type":"skip"' "$work/nanstop/log.jsonl")" -eq 2
expect_error "--inject-nan grads:3: expected gradient:STEP or moment:STEP" train -o "$work/x" --inject-nan grads:3

# 4. the default command on the CPU: a short run that says so, with a validation that shows its progress
# (80 batches of the default model take over 5 s); stopped during that validation, with no checkpoint (-n -1)
./train_gpt_sparse -m 80 -n -1 -o "$work/default" > "$work/default.txt" 2>&1 &
pid=$!
for _ in $(seq 1200); do grep -q "^step 0 | validation: " "$work/default.txt" && break; kill -0 $pid 2> /dev/null || break; sleep 0.1; done
kill -TERM $pid
wait $pid
check "the default run on the CPU is short and says so" \
    grep -q "^a short first run on the CPU: 150 steps with 15 of warmup (10 to 15 minutes on 2 cores), validating every 50 on 80 batches and at the end on the whole val set; the full run is -x 2000" "$work/default.txt"
check "a long validation shows its progress" grep -qE "^step 0 \| validation: [0-9]+/80 batches \| ETA [0-9hms]+$" "$work/default.txt"
check "stopped in the validation, no checkpoint with -n -1" grep -q "^stopped at step 0 of 150 (SIGTERM); no checkpoint (-n -1)$" "$work/default.txt"
# the short run whole, on a model small enough (without -x the steps, warmup and validations are the default
# run's): 150 steps, 15 of warmup, one checkpoint at the end
./train_gpt_sparse --layers 1 --dim 8 --heads 1 --hidden 8 -t 8 -b 1 -s 0 --final-val-batches 2 -o "$work/short" > "$work/short.txt" 2>&1
check "the short run exits 0" test $? -eq 0
check "... warms up over 15 steps ($(lr_of "$work/short" 1), $(lr_of "$work/short" 15))" \
    awk -v a="$(lr_of "$work/short" 1)" -v b="$(lr_of "$work/short" 15)" 'BEGIN {exit !(a > 6.6e-5 && a < 6.7e-5 && b > 0.99e-3 && b < 1.01e-3)}'
check "... validates at 0, 50, 100 and 150" test "$(json_field "$work/short/log.jsonl" val step | tr '\n' ' ')" = "0 50 100 150 "
check "... and writes one checkpoint, at the end" test "$(ls "$work/short" | tr '\n' ' ')" = "log.jsonl model_00000150.bin state_00000150_00000.bin "

# 5. infer without -m loads the newest checkpoint of out/, -m DIR the newest of DIR; none is one clear line
mkdir -p "$work/cwd" "$work/empty"
ln -s "$repo/data" "$work/cwd/data"
ln -s "$work/a" "$work/cwd/out"
(cd "$work/cwd" && "$repo/infer" -p "The sea" -n 4 -t 0 --device cpu > /dev/null 2> "$work/infer_out.txt")
check "infer with no -m loads the newest checkpoint in out/" grep -q "^model: out/model_00000024.bin (step 24," "$work/infer_out.txt"
./infer -m "$work/a" -p "The sea" -n 4 -t 0 --device cpu > /dev/null 2> "$work/infer_dir.txt"
check "infer -m DIR loads its newest checkpoint" grep -q "^model: $work/a/model_00000024.bin (step 24," "$work/infer_dir.txt"
rm "$work/cwd/out"
expect_error "no -m given, and out/ holds no checkpoint (model_<step>.bin): train one with ./train_gpt_sparse" \
    bash -c 'cd "$0" && "$1/infer" -p hi' "$work/cwd" "$repo"
expect_error "-m $work/empty: the directory holds no checkpoint (model_<step>.bin)" ./infer -m "$work/empty" -p hi

# 6. run from another directory, the default data is found beside the binaries; where neither has it, one line
# says where it looked
(cd "$work/empty" && "$repo/train_gpt_sparse" "${tiny[@]}" -x 1 -v 0 -n -1 -o "$work/away" > "$work/away.txt" 2>&1)
check "the trainer run from another directory finds its data" grep -q "^step     1/1 " "$work/away.txt"
(cd "$work/empty" && "$repo/infer" -m "$work/a" -p "The sea" -n 4 -t 0 > /dev/null 2> "$work/infer_away.txt")
check "infer run from another directory finds its tokenizer" grep -q "^prompt " "$work/infer_away.txt"
mkdir -p "$work/bin"
cp tokenize "$work/bin/"
expect_error "data/r50k_base.tiktoken (the default of -t) is neither under the working directory $work/empty nor under the binary's $work/bin: give -t" \
    bash -c 'cd "$0" && "$1/tokenize" -o x "$2"' "$work/empty" "$work/bin" "$repo/README.md"

finish
