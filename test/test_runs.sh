#!/usr/bin/env bash
# What a training run does with its output directory, and with steps that go
# wrong, on the CPU path (a tiny model): a new run never mixes with another
# (refused, or --overwrite 1 deletes it, or --resume 1 continues it, said in one
# line); a resume with nothing left to do or a state file of another step is an
# error; a step with a NaN gradient is skipped with the weights unchanged, too
# many in a row stop the run, and no checkpoint ever holds a NaN. First contact:
# the default run on the CPU is a short one that says so, every step line has an
# ETA, a long validation shows its progress, and infer finds the newest checkpoint.
set -u
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
set -m # job control: background runs get SIGTERM's default
TEST_NAME=runs
. test/check.sh

tiny=(--layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 128 -t 32 -b 2 -u 5 -l 3e-3 -s 0 -m 2)
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
train -x 24 -v 0 -n 0 -o "$work/a" -y 1 > "$work/a2.txt" 2>&1
check "--resume 1 continues and says so in one line" grep -q "^resumed from $work/a/model_00000020.bin at step 20 (of 24)$" "$work/a2.txt"

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
    grep -q "^a short first run on the CPU: 150 steps (about 10 minutes on 2 cores), validating every 50 on 80 batches; the full run is -x 2000" "$work/default.txt"
check "a long validation shows its progress" grep -qE "^step 0 \| validation: [0-9]+/80 batches \| ETA [0-9hms]+$" "$work/default.txt"
check "stopped in the validation, no checkpoint with -n -1" grep -q "^stopped at step 0 of 150 (SIGTERM); no checkpoint (-n -1)$" "$work/default.txt"

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

finish
