#!/usr/bin/env bash
# Every command in a code block of README.md and docs/*.md runs as written, on the CPU path, in a scratch
# copy of the checkout (the binaries, data/ and scripts/ linked) after a short default-like run, as a user
# who just made the default run would type it. Commands that would train for long run with short flags
# (-x 1 and a tiny model instead of -x 1000 and the default one); a placeholder (MODEL_DIR, OUT, FILE...)
# is filled in. The few that need what this machine cannot have are skipped, each with a SKIP line saying
# why. A command in the docs that this test does not know is a failure, and so is one it knows that the
# docs no longer hold: the two lists stay the same.
set -u
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
TEST_NAME=readme
. test/check.sh
export CUDA_VISIBLE_DEVICES= # the CPU path, even where there is a GPU

# the commands of the docs' code blocks, one per line: continuation lines joined, trailing comments and
# runs of blanks dropped; a line that starts with no program (an example of output) is not a command
doc_commands() {
    awk '/^```/ { block = !block; next }
         block {
             line = $0
             cmd = cmd (cmd == "" ? "" : " ") line
             quotes = gsub(/"/, "\"", cmd)
             if (line ~ /\\$/) { sub(/\\$/, "", cmd); next }
             if (quotes % 2 == 1) next
             print cmd
             cmd = ""
         }' README.md docs/*.md |
        sed -E 's/[[:space:]]+#[^"]*$//; s/[[:space:]]+/ /g; s/^ //; s/ $//' |
        grep -E '^(\./|scripts/|make|hf |sbatch |python3 |bash )' | sort -u
}

scratch="$work/checkout"
mkdir -p "$scratch"
for f in train_gpt_sparse infer tokenize hf_convert analyze data scripts; do ln -s "$repo/$f" "$scratch/$f"; done
known=() # the commands this test runs or skips, as doc_commands writes them

# doc CMD [FROM=>TO]...: runs CMD in the scratch checkout with the replacements made (short flags, filled-in
# placeholders); its output in $out; a failure if it exits non-zero
doc() {
    local cmd=$1 run=$1 sub
    shift
    known+=("$cmd")
    for sub in "$@"; do run=${run//"${sub%%=>*}"/"${sub#*=>}"}; done
    out=$(cd "$scratch" && bash -c "$run" 2>&1)
    local rc=$?
    check "'$run' exits 0 (got $rc)" test $rc -eq 0
    [ $rc -eq 0 ] || echo "$out" | tail -n 5
}
# skip CMD WHY
skip() {
    known+=("$1")
    local shown=$1
    [ ${#shown} -le 64 ] || shown="${shown:0:61}..."
    echo "SKIP readme: '$shown' ($2)"
}

# a tiny model for the runs the docs make with the default one, and the validations kept short
tiny="--layers 2 --dim 64 --heads 4 --hidden 128 -t 64 -m 1 --final-val-batches 1"

# README: build (make test built everything: the make of "make && ./train_gpt_sparse" is left out), the
# default run, the tests, generation
skip "make test" "this is make test"
doc "make && ./train_gpt_sparse" "make && =>" "./train_gpt_sparse=>./train_gpt_sparse -x 1 $tiny"
check "the default-like run wrote out/" test -f "$scratch/out/model_00000001.bin"
doc './infer -p "It is a truth universally acknowledged"'
check "infer generated from out/'s newest checkpoint" grep -q "^model: out/model_00000001.bin (step 1," <<< "$out"

# several GPUs
skip "scripts/launch_local.sh 2 -e 1.5b -b 4 -t 2048" "needs 2 GPUs"
skip "scripts/launch_mpi.sh 16 -e 1.5b ..." "needs MPI and GPUs"
skip "sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 scripts/launch_slurm.sh -e 1.5b ..." "needs Slurm and GPUs"

# tokenize (the synopsis, filled in): shards of the docs' text, which the ReLUfication below trains on
doc "./tokenize -o OUT [flags] FILE..." "OUT=>shards/x" "[flags]=>--val-docs 1" "FILE...=>$repo/README.md $repo/docs/MODEL.md"
check "tokenize wrote a val and a train shard" test -f "$scratch/shards/x_val_000000.bin" -a -f "$scratch/shards/x_train_000001.bin"

# ReLUfication (README and docs/TRAINING.md), from a stand-in for a Hugging Face model: out/'s export
(cd "$scratch" && ./hf_convert --export out -o MODEL_DIR > /dev/null 2>&1)
doc "./hf_convert --import MODEL_DIR -o dense"
doc './train_gpt_sparse --init-from dense/model.bin --activation relu -a 1e-2 --l1-ramp 100 -l 6e-4 -u 20 -x 1000 -i "shards/x_train_*.bin" -j "shards/x_val_*.bin" -o relufied' \
    "-x 1000=>-x 1 -m 1 --final-val-batches 1"
doc "./hf_convert --export relufied --tokenizer dense/tokenizer.json -o sparse_hf"
check "the export took relufied's newest checkpoint" grep -q "^model: relufied/model_00000001.bin (step 1)" <<< "$out"

# analyze
doc './analyze -m out "data/corpus_val_*.bin" -o analysis.json'
check "the analysis was written" test -s "$scratch/analysis.json"

# HellaSwag (README and docs/TRAINING.md): the data script on the test fixture through a file:// address (the
# download needs the network), writing into the scratch checkout; then the runs that score it
doc "bash dev/data/hellaswag.sh" \
    "bash dev/data/hellaswag.sh=>HELLASWAG_URL=file://$repo/test/data/eval/hellaswag_fixture.jsonl bash $repo/dev/data/hellaswag.sh -o $scratch/dev/data/hellaswag"
check "the data script wrote the eval file" test -s "$scratch/dev/data/hellaswag/hellaswag_val.bin"
doc "./train_gpt_sparse --eval-file dev/data/hellaswag/hellaswag_val.bin -i ... -j ..." "-i ... -j ...=>-x 1 $tiny -o hellaswag"
check "the run logged its evaluations" grep -q '"type":"eval","step":1,' "$scratch/hellaswag/log.jsonl"
doc "./train_gpt_sparse --eval-file dev/data/hellaswag/hellaswag_val.bin [--eval-every N] [--eval-examples N] ..." \
    "[--eval-every N] [--eval-examples N] ...=>--eval-every 1 --eval-examples 4 -x 1 $tiny -o hellaswag4"
check "the run scored 4 examples" grep -q '"n":4,' "$scratch/hellaswag4/log.jsonl"

# serving: a server runs until it is stopped (test_serve.sh starts one on a free loopback port and queries it)
skip "./infer --serve --port 8080 &" "a server on a fixed port; test_serve.sh serves on a free one"
skip "./infer -m out --serve --port 8080" "a server on a fixed port; test_serve.sh serves on a free one"

# hf_convert, with a stand-in for SakanaAI/SparseLM1B: out/'s export
skip "hf download SakanaAI/SparseLM1B --local-dir SparseLM1B" "downloads from the Hugging Face hub"
(cd "$scratch" && ./hf_convert --export out -o SparseLM1B > /dev/null 2>&1)
doc "./hf_convert --import SparseLM1B -o sparselm1b"
doc './infer -m sparselm1b/model.bin --tokenizer sparselm1b/tokenizer.json -p "The history of the printing press" -t 0.8 -k 50'
doc "./hf_convert --export out --dtype bf16 -o hf_model"
check "the export took out/'s newest checkpoint" grep -q "^model: out/model_00000001.bin (step 1)" <<< "$out"
skip "python3 -c \" from transformers import AutoModelForCausalLM, AutoTokenizer m, t = AutoModelForCausalLM.from_pretrained('hf_model'), AutoTokenizer.from_pretrained('hf_model') print(t.decode(m.generate(**t('<|endoftext|>It is a truth', return_tensors='pt'), max_new_tokens=20)[0]))\"" \
    "needs Python with torch and transformers"

# L1 sweeps. As written, on the CPU: each run the trainer's short first run, which the sweep says; stopped once
# the first run has validated step 0, to be resumed
(cd "$scratch" && exec scripts/sweep_l1.sh > "$work/sweep.txt" 2>&1) &
pid=$!
for _ in $(seq 1200); do
    grep -q '"type":"val"' "$scratch/sweeps/l1/lambda_0/log.jsonl" 2> /dev/null && break
    kill -0 $pid 2> /dev/null || break
    sleep 0.1
done
kill -TERM $pid 2> /dev/null
wait $pid
rc=$?
known+=("scripts/sweep_l1.sh")
check "the sweep says it makes short runs on the CPU" \
    grep -q "^on the CPU: each of the 6 runs is the trainer's short first run of 150 steps (10 to 15 minutes each on 2 cores); -- -x 2000 makes the full runs" "$work/sweep.txt"
check "the sweep's first run is the short one" grep -q "^a short first run on the CPU: 150 steps" "$scratch/sweeps/l1/lambda_0/train.log"
check "stopped, the sweep exits 130 (got $rc) and says how to resume" \
    bash -c '[ "$0" -eq 130 ] && grep -q "run the same command again to resume" "$1"' "$rc" "$work/sweep.txt"
doc "scripts/sweep_l1.sh -l 0,2e-5 -o sweeps/short -- -x 500" "-x 500=>-x 1 $tiny"
check "the short sweep wrote its table" test -s "$scratch/sweeps/short/results.md"
doc "scripts/sweep_l1.sh --report-only"
check "the report of the stopped sweep" test -s "$scratch/sweeps/l1/results.csv"

# the docs hold exactly the commands above
while IFS= read -r cmd; do
    found=0
    for k in "${known[@]}"; do [ "$k" = "$cmd" ] && found=1; done
    check "test_readme.sh runs or skips the docs' command '$cmd'" test $found -eq 1
done < <(doc_commands)
documented=$(doc_commands)
for k in "${known[@]}"; do
    check "the docs still hold '$k'" grep -qxF -- "$k" <<< "$documented"
done

finish
