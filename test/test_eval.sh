#!/usr/bin/env bash
# Tests of the multiple-choice evaluation end to end, on the CPU path and offline: ./tokenize --hellaswag
# writes, for a hand-written HellaSwag-format fixture, the bytes an independent implementation made
# (test/data/eval/make_expected.mjs: gpt-tokenizer) and rejects bad input with one line; dev/data/hellaswag.sh
# tokenizes a local file and "downloads" one from a file:// address; the trainer's --eval-file scores a tiny
# model at step 0, every --eval-every steps and at the end (console and log.jsonl), resumes without
# repeating or losing an evaluation (also one cut short by a stop), and refuses bad flags and files;
# infer --eval gives the trainer's numbers on the same checkpoint and examples, whatever its rows per forward.
set -u
cd "$(dirname "$0")/.." || exit 1
TEST_NAME=test_eval
. test/check.sh
D=test/data/eval
fixture=$D/hellaswag_fixture.jsonl
expected=$D/hellaswag_fixture.bin
N=$(grep -cv '^[[:space:]]*$' $fixture)

# 1. tokenize --hellaswag
./tokenize --hellaswag -o "$work/val.bin" $fixture > "$work/tok.txt" 2>&1
check "tokenize --hellaswag exits 0" test $? -eq 0
check "the eval file is the independent implementation's, byte for byte" cmp -s "$expected" "$work/val.bin"
check "tokenize says what it wrote" grep -q "^tokenize: $N examples of 4 endings, [0-9]* tokens" "$work/tok.txt"
check "header: magic, version, $N examples, 4 endings, vocabulary 50257" \
    test "$(od -An -td4 -N20 "$work/val.bin" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')" = "20261124 1 $N 4 50257"
./tokenize --hellaswag -o "$work/stdin.bin" - < $fixture > /dev/null 2>&1
check "tokenize --hellaswag from standard input" cmp -s "$expected" "$work/stdin.bin"
head -n 3 $fixture > "$work/a.jsonl"; printf '\n' >> "$work/a.jsonl"; tail -n +4 $fixture > "$work/b.jsonl"
./tokenize --hellaswag -o "$work/two.bin" "$work/a.jsonl" "$work/b.jsonl" > /dev/null 2>&1
check "tokenize --hellaswag: two files and a blank line are one set" cmp -s "$expected" "$work/two.bin"
line() { sed -n "${1}p" $fixture; }
bad() { printf '%s\n' "$(line 1)" "$1" > "$work/bad.jsonl"; }
bad '{"ctx": "x", "endings": ["a", "b"'
expect_error "$work/bad.jsonl:2: invalid JSON at line 1" ./tokenize --hellaswag -o "$work/x.bin" "$work/bad.jsonl"
bad '{"endings": ["a", "b", "c", "d"], "label": 0}'
expect_error "$work/bad.jsonl:2: expected a string \"ctx\"" ./tokenize --hellaswag -o "$work/x.bin" "$work/bad.jsonl"
bad '{"ctx": "x", "endings": ["a", "b", "c"], "label": 0}'
expect_error "bad.jsonl:2: 3 endings, the first example has 4" ./tokenize --hellaswag -o "$work/x.bin" "$work/bad.jsonl"
bad '{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 4}'
expect_error "bad.jsonl:2: expected \"label\", the index of the right ending: an integer from 0 to 3" \
    ./tokenize --hellaswag -o "$work/x.bin" "$work/bad.jsonl"
bad '{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": "1"}'
expect_error "bad.jsonl:2: expected \"label\"" ./tokenize --hellaswag -o "$work/x.bin" "$work/bad.jsonl"
bad '{"ctx": "x", "endings": ["a", "b", 3, "d"], "label": 1}'
expect_error "bad.jsonl:2: ending 2 is not a string" ./tokenize --hellaswag -o "$work/x.bin" "$work/bad.jsonl"
printf '\n \n' > "$work/empty.jsonl"
expect_error "no examples in the input" ./tokenize --hellaswag -o "$work/x.bin" "$work/empty.jsonl"
expect_error "the input holds $N examples, --total-docs says 10042" \
    ./tokenize --hellaswag -o "$work/x.bin" --total-docs 10042 $fixture
expect_error "--hellaswag writes one eval file: --shard-tokens is for shards" ./tokenize --hellaswag -s 100 -o "$work/x.bin" $fixture
check "no eval file written by a failed run" test ! -e "$work/x.bin"

# 2. dev/data/hellaswag.sh, offline
hs() { bash dev/data/hellaswag.sh "$@"; }
check "hellaswag.sh --help" bash -c 'bash dev/data/hellaswag.sh --help | grep -q -- "--local F"'
hs --local $fixture -o "$work/hl" > "$work/hl.txt" 2>&1
check "hellaswag.sh --local: the expected eval file" cmp -s "$expected" "$work/hl/hellaswag_val.bin"
check "hellaswag.sh says how to use it" grep -q -- "--eval-file $work/hl/hellaswag_val.bin" "$work/hl.txt"
HELLASWAG_URL="file://$PWD/$fixture" hs -o "$work/net" > "$work/net.txt" 2>&1
check "hellaswag.sh downloads (from a file:// address) and tokenizes" cmp -s "$expected" "$work/net/hellaswag_val.bin"
check "hellaswag.sh keeps the download" cmp -s $fixture "$work/net/hellaswag_val.jsonl"
rm "$work/net/hellaswag_val.bin"
HELLASWAG_URL="file://$work/nothing.jsonl" hs -o "$work/net" > "$work/net2.txt" 2>&1
check "a rerun tokenizes the kept download again, without downloading" \
    bash -c '! grep -q downloading "$0" && cmp -s "$1" "$2"' "$work/net2.txt" "$expected" "$work/net/hellaswag_val.bin"
HELLASWAG_URL="file://$work/nothing.jsonl" hs -o "$work/none" > "$work/none.txt" 2>&1
check "a failed download is an error" grep -q "^error: cannot download file://$work/nothing.jsonl" "$work/none.txt"
check "a failed download leaves no file" test -z "$(ls "$work/none")"
expect_error "-m is gpt2 or llama3, got 'gpt3'" hs -m gpt3 -o "$work/e"
expect_error "--local $work/missing.jsonl is not a file" hs --local "$work/missing.jsonl" -o "$work/e"
expect_error "-m llama3 needs --tokenizer FILE" hs -m llama3 -o "$work/e"

# 3. the trainer: 2 layers, D 64, 3 sequences of 32 tokens (the fixture's rows of 4 endings span forwards;
# its long contexts are cut to fit)
tiny=(--layers 2 --dim 64 --heads 4 --hidden 128 -b 3 -t 32 -u 2 -l 3e-3 -m 2 -s 0 -v 3)
train() { ./train_gpt_sparse "${tiny[@]}" "$@"; }
train -o "$work/run" -x 6 -n 3 --eval-file "$expected" > "$work/run.txt" 2>&1
check "training with --eval-file exits 0" test $? -eq 0
check "the run announces the evaluation" \
    grep -q "^eval: $expected, $N of its $N examples (4 endings each), every 3 steps" "$work/run.txt"
check "eval lines at steps 0, 3 and 6" test "$(json_field "$work/run/log.jsonl" eval step | tr '\n' ' ')" = "0 3 6 "
check "each of $N examples" test "$(json_field "$work/run/log.jsonl" eval n | sort -u)" = "$N"
cut=$(json_field "$work/run/log.jsonl" eval truncated | tail -n 1)
check "contexts cut to fit 32 positions: $cut" test "$cut" -gt 0
last=$(grep '"type":"eval","step":6' "$work/run/log.jsonl")
acc=$(echo "$last" | sed -E 's/.*"acc":([0-9.e+-]+).*/\1/')
acc_norm=$(echo "$last" | sed -E 's/.*"acc_norm":([0-9.e+-]+).*/\1/')
check "accuracies are counts of $N ($acc, $acc_norm)" \
    awk -v a="$acc" -v b="$acc_norm" -v n="$N" 'BEGIN {x = a * n; y = b * n; exit !(x == int(x) && y == int(y) && a <= 1 && b <= 1)}'
console=$(printf "step 6 | eval acc_norm %.4f (acc %.4f, %d examples of %s, %d contexts cut to fit)" "$acc_norm" "$acc" "$N" "$expected" "$cut")
check "the console line: $console" grep -qxF "$console" "$work/run.txt"
check "the eval line follows the val line" \
    awk '/^step 6 \| val ce/ {v = NR} /^step 6 \| eval acc_norm/ {e = NR} END {exit !(v && e == v + 1)}' "$work/run.txt"
train -o "$work/few" -x 6 -n 3 --eval-file "$expected" --eval-examples 5 --eval-every 0 > "$work/few.txt" 2>&1
check "--eval-every 0: one evaluation, at the end" test "$(json_field "$work/few/log.jsonl" eval step | tr '\n' ' ')" = "6 "
check "--eval-examples 5" test "$(json_field "$work/few/log.jsonl" eval n)" = 5
check "evaluating changes nothing in training" cmp -s "$work/run/model_00000006.bin" "$work/few/model_00000006.bin"
# resume from step 3 (whose evaluation the checkpoint holds): the log of the run that never stopped
mkdir -p "$work/res"
cp "$work/run/model_00000003.bin" "$work/run/state_00000003_00000.bin" "$work/run/log.jsonl" "$work/res/"
train -o "$work/res" -x 6 -n 3 --eval-file "$expected" -y 1 > "$work/res.txt" 2>&1
check "resumed run exits 0" test $? -eq 0
check "resumed log equals the uninterrupted one, evaluations included" \
    cmp -s <(strip_timing "$work/run/log.jsonl") <(strip_timing "$work/res/log.jsonl")
# a stop during the last step's evaluation (of 48 examples, a while): both it and that step's validation
# are cut short, the checkpoint marks them to do, and the resumed run logs them as the uninterrupted run did
. test/train_lib.sh
for _ in $(seq 6); do cat $fixture; done > "$work/many.jsonl"
./tokenize --hellaswag -o "$work/many.bin" "$work/many.jsonl" > /dev/null 2>&1
long=(-x 3 -n 0 --eval-file "$work/many.bin" --eval-every 0)
train -o "$work/sref" "${long[@]}" > /dev/null 2>&1
./train_gpt_sparse "${tiny[@]}" -o "$work/sig" "${long[@]}" > "$work/sig.txt" 2>&1 & # (the trainer itself: $! is its pid)
stop_at "$work/sig" 3 $! TERM # the evaluation starts right after the train line of step 3 and its short validation
check "stopped in the evaluation: exit 143 (got $rc)" test "$rc" -eq 143
check "the validation and evaluation of step 3 are cut short" \
    grep -q "^step 3 | validation and evaluation cut short by the stop; they run when the run continues$" "$work/sig.txt"
check "no evaluation of step 3 logged" bash -c '! grep -q "\"type\":\"eval\",\"step\":3" "$0"' "$work/sig/log.jsonl"
train -o "$work/sig" "${long[@]}" -y 1 > "$work/sig2.txt" 2>&1
check "the resumed run evaluates step 3" grep -q "^step 3 | eval acc_norm" "$work/sig2.txt"
check "the resumed log equals the uninterrupted one" \
    cmp -s <(strip_timing "$work/sref/log.jsonl") <(strip_timing "$work/sig/log.jsonl")
expect_error "--eval-every needs --eval-file" train -o "$work/e" -x 2 --eval-every 1
expect_error "--eval-examples needs --eval-file" train -o "$work/e" -x 2 --eval-examples 3
expect_error "cannot open $work/missing.bin" train -o "$work/e" -x 2 --eval-file "$work/missing.bin"
expect_error "data/corpus_val_000000.bin is not an eval file: magic 20240520" \
    train -o "$work/e" -x 2 --eval-file data/corpus_val_000000.bin
expect_error "$expected: example 0's ending 0 is 15 tokens, more than the 8 positions of a row can score" \
    ./train_gpt_sparse --layers 1 --dim 32 --heads 2 --hidden 32 -b 2 -t 8 -o "$work/e" -x 2 --eval-file "$expected"
check "no run started by a bad flag" test ! -e "$work/e/log.jsonl"

# 4. infer --eval: the trainer's numbers on its checkpoint
ckpt="$work/run/model_00000006.bin"
for b in 3 16; do
    ./infer -m "$ckpt" --eval "$expected" --eval-batch $b > "$work/infer$b.txt" 2> "$work/infer$b.err"
    check "infer --eval --eval-batch $b exits 0" test $? -eq 0
    check "infer --eval --eval-batch $b: the trainer's numbers" grep -qxF "eval ${console#step 6 | eval }" "$work/infer$b.txt"
done
check "infer --eval names the model and the rows" \
    grep -q "model: $ckpt (step 6, 2 layers, D 64, H 128) on the CPU reference path | $N examples, 16 rows of 32 positions" "$work/infer16.err"
few=$(grep '"type":"eval"' "$work/few/log.jsonl")
acc5=$(echo "$few" | sed -E 's/.*"acc":([0-9.e+-]+).*/\1/')
norm5=$(echo "$few" | sed -E 's/.*"acc_norm":([0-9.e+-]+).*/\1/')
./infer -m "$work/run" --eval "$expected" --eval-examples 5 -q 1 > "$work/infer5.txt" 2> "$work/infer5.err"
check "infer --eval-examples 5: the numbers of the run evaluating 5" \
    grep -q "^eval acc_norm $(printf %.4f "$norm5") (acc $(printf %.4f "$acc5"), 5 examples of $expected" "$work/infer5.txt"
check "infer -q 1: no model line" test ! -s "$work/infer5.err"
expect_error "--eval scores the model on a file: drop --prompt" ./infer -m "$ckpt" --eval "$expected" -p hi
expect_error "--eval-batch needs --eval" ./infer -m "$ckpt" -p hi --eval-batch 4
expect_error "--eval runs the dense forward: drop --ffn" ./infer -m "$ckpt" --eval "$expected" --ffn dense
expect_error "data/corpus_val_000000.bin is not an eval file" ./infer -m "$ckpt" --eval data/corpus_val_000000.bin

finish
