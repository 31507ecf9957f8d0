#!/usr/bin/env bash
# Stopping a training run with SIGTERM or SIGINT on the CPU path (a tiny model):
# the run finishes its step (or cuts its validation short), writes a complete
# checkpoint, says how to continue and ends by the signal; continued with
# --resume 1 it repeats the uninterrupted run bit for bit (log and checkpoints).
# A second signal stops at once; a signal ignored when the run started stays
# ignored.
set -u
cd "$(dirname "$0")/.." || exit 1
set -m # job control: background runs get SIGINT (a script's background jobs otherwise ignore it)
TEST_NAME=signals
. test/check.sh

# 2 layers, D 64, 2 x 32 tokens per step; a validation of 40 batches takes longer than a step
tiny=(--layers 2 --dim 64 --heads 4 --kv-heads 2 --hidden 128 -t 32 -u 5 -l 3e-3 -s 0 --final-val-batches 40)
run=(-b 2 -v 30 -m 40 -n 30) # and -x 60
train() { ./train_gpt_sparse "${tiny[@]}" "$@"; } # (in the background: the trainer itself, so that $! is its pid)
source test/train_lib.sh
same_as_reference() { # same_as_reference DIR: the log and the last checkpoint of the uninterrupted run
    cmp -s <(strip_timing "$work/ref/log.jsonl") <(strip_timing "$1/log.jsonl") &&
        cmp -s "$work/ref/model_00000060.bin" "$1/model_00000060.bin"
}

train "${run[@]}" -x 60 -o "$work/ref" > "$work/ref.txt" 2>&1
check "uninterrupted run exits 0" test $? -eq 0

# 1. SIGTERM during training: the step finishes, a checkpoint of it is written, the run says how to continue
./train_gpt_sparse "${tiny[@]}" "${run[@]}" -x 60 -o "$work/term" > "$work/term.txt" 2>&1 &
stop_at "$work/term" 5 $! TERM
check "SIGTERM: the run ends by the signal (exit $rc)" test $rc -eq 143
check "SIGTERM: the run says that it stops" grep -q "stop requested: finishing this step, then writing a checkpoint" "$work/term.txt"
stop=$(sed -n 's/^stopped at step \([0-9]*\) of 60 (SIGTERM): the checkpoint is .*; to continue, run the same command with --resume 1$/\1/p' "$work/term.txt")
check "SIGTERM: one line says where the checkpoint is and how to continue" test -n "$stop"
stop=${stop:-0}
check "SIGTERM: stopped before the end (step $stop)" test "$stop" -ge 5 -a "$stop" -lt 60
check "SIGTERM: the checkpoint of step $stop is complete" \
    test -f "$work/term/$(printf 'model_%08d.bin' "$stop")" -a -f "$work/term/$(printf 'state_%08d_00000.bin' "$stop")"
check "SIGTERM: the log ends at step $stop" test "$(last_step "$work/term/log.jsonl")" -eq "$stop"
check "SIGTERM: no temporary files left" test -z "$(ls "$work/term" | grep tmp)"
train "${run[@]}" -x 60 -o "$work/term" -y 1 > "$work/term2.txt" 2>&1
check "SIGTERM: the resumed run exits 0" test $? -eq 0
check "SIGTERM: resumed, the log and checkpoints equal the uninterrupted run's" same_as_reference "$work/term"

# 2. SIGINT during a validation: cut short, the checkpoint of its step marks it as still to do, and the
# continued run validates first (SIGINT's default action restored for the run: a test started as a background
# job of a shell without job control inherits it ignored, which no shell can undo; coreutils 8.31 and later)
default_int=()
env --default-signal=INT true 2> /dev/null && default_int=(env --default-signal=INT)
"${default_int[@]}" ./train_gpt_sparse "${tiny[@]}" "${run[@]}" -x 60 -o "$work/int" > "$work/int.txt" 2>&1 &
stop_at "$work/int" 30 $! INT # the validation of step 30 starts right after its train line
check "SIGINT: the run ends by the signal (exit $rc)" test $rc -eq 130
check "SIGINT: the validation is cut short" grep -q "step 30 | validation cut short by the stop" "$work/int.txt"
check "SIGINT: stopped at step 30" grep -q "^stopped at step 30 of 60 (SIGINT): the checkpoint is $work/int/model_00000030.bin" "$work/int.txt"
check "SIGINT: no validation of step 30 logged" bash -c '! grep -q "\"type\":\"val\",\"step\":30" "$0"' "$work/int/log.jsonl"
cp -r "$work/int" "$work/int_copy"
train "${run[@]}" -x 60 -o "$work/int" -y 1 > "$work/int2.txt" 2>&1
check "SIGINT: the resumed run exits 0" test $? -eq 0
first=$(awk '/^ffn:/ {on = 1; next} on && /^step/ && !/validation:/ {print; exit}' "$work/int2.txt")
check "SIGINT: the resumed run validates step 30 first ($first)" grep -q "^step 30 | val ce" <<< "$first"
check "SIGINT: resumed, the log and checkpoints equal the uninterrupted run's" same_as_reference "$work/int"
# the checkpoint of step 30 is still to validate: resuming it with -x 30 validates and ends; once more is an error
train "${run[@]}" -x 30 -o "$work/int_copy" -y 1 > "$work/int3.txt" 2>&1
check "a stopped run resumed at its -x validates and exits 0" test $? -eq 0
check "... it logged the validation of step 30" grep -q '"type":"val","step":30' "$work/int_copy/log.jsonl"
out=$(train "${run[@]}" -x 30 -o "$work/int_copy" -y 1 2>&1 > /dev/null)
check "... and once done, a run with nothing left to do is an error" \
    bash -c '[ "$(printf "%s\n" "$0" | wc -l)" -eq 1 ] && [[ "$0" == *"already reached step 30 = -x: nothing to train"* ]]' "$out"

# 3. a second signal stops at once, without a checkpoint (steps of 64 x 32 tokens take long enough)
./train_gpt_sparse "${tiny[@]}" -x 5 -v 0 -n 0 -b 64 -o "$work/twice" > "$work/twice.txt" 2>&1 &
pid=$!
wait_for_step "$work/twice" 1 $pid
kill -TERM $pid
sleep 0.2
kill -TERM $pid
wait $pid
rc=$?
check "second signal: the run ends by it (exit $rc)" test $rc -eq 143
check "second signal: the run says so" grep -q "second signal: stopping at once, without a checkpoint" "$work/twice.txt"
check "second signal: no checkpoint" test "$(ls "$work/twice" | grep -c '^model_')" -eq 0
check "second signal: no stop line" bash -c '! grep -q "^stopped at step" "$0"' "$work/twice.txt"

# 4. ignored when the run started (a background job of a script that forwards it): stays ignored
(trap '' INT; exec ./train_gpt_sparse "${tiny[@]}" -b 2 -x 30 -v 0 -n 0 -o "$work/ignored" > "$work/ignored.txt" 2>&1) &
pid=$!
wait_for_step "$work/ignored" 2 $pid
kill -INT $pid
wait $pid
check "an ignored SIGINT stays ignored: the run finishes" test $? -eq 0 -a -f "$work/ignored/model_00000030.bin"

finish
