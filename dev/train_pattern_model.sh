#!/usr/bin/env bash
# The "trained" pattern of the FFN benchmarks: trains, on one GPU in under 10
# minutes from the corpus in data/, a model at the standard FFN width (D 2048,
# H 5632, 4 layers, sequences of 1024) with the L1 term strong enough that its
# gates fire for about 30 units per token, and leaves its last checkpoint in
# build/pattern_model/ (outside git: this script is the recipe). Then e.g.
#     build/dev/bench_ffn trained build/pattern_model/model_00001500.bin 1
# usage: bash dev/train_pattern_model.sh [lambda] [steps] [dir]    (defaults below;
# the log's l0 column shows the units per token as the run goes)
set -eu
cd "$(dirname "$0")/.."
lambda=${1:-1e-4}
steps=${2:-1500}
out=${3:-build/pattern_model}
rm -rf "$out"
./train_gpt_sparse --layers 4 --dim 2048 --heads 16 --kv-heads 16 --hidden 5632 -t 1024 -b 16 \
    -x "$steps" -u 100 -l 1e-3 -a "$lambda" --ffn auto -v 0 -s 0 -n 0 -o "$out"
echo "checkpoint: $(ls "$out"/model_*.bin | tail -n 1)"
