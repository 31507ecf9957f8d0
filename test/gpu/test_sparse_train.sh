#!/usr/bin/env bash
# Multi-step training through the sparse FFN on the GPU against the dense FFN,
# same model, data and seed:
# - --ffn sparse from the first step (half the units fire at init, so the rows
#   overflow the ELL width and the first forward's tail: the tail is grown and
#   the forward redone, which the log says): the loss curve matches --ffn dense
#   within bf16 noise;
# - a strong L1 term (-a 0.02) with --ffn auto: layers turn sparse as their
#   activity falls (the log says which and when), and the loss curve matches
#   the same run with --ffn dense.
set -u
cd "$(dirname "$0")/../.."
passed=0; failed=0
check() {
    local what=$1; shift
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL sparse_train: $what"; fi
}
work=$(mktemp -d /tmp/test_sparse_train_XXXXXX)
trap 'rm -rf "$work"' EXIT
small=(--layers 2 --dim 128 --heads 4 --kv-heads 2 --hidden 1024 -b 8 -t 128 -u 10 -l 3e-3 -s 0 -m 4 -v 0 -n 0)
losses() { grep '"type":"train"' "$1" | sed -E 's/.*"loss":([-0-9.e+]+).*/\1/'; }
# prints the largest |a - b| of the two loss curves and fails when it exceeds $3 or a curve is short
compare() {
    paste <(losses "$1") <(losses "$2") | awk -v tol="$3" -v steps="$4" '
        { d = $1 - $2; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
        END { printf "%d steps, largest loss difference %.4f (tolerance %g)\n", n, worst, tol; exit !(n == steps && worst < tol) }'
}

./train_gpt_sparse "${small[@]}" -x 40 -o "$work/dense" --ffn dense > "$work/dense.txt" 2>&1
check "dense run exits 0" test $? -eq 0
./train_gpt_sparse "${small[@]}" -x 40 -o "$work/sparse" --ffn sparse > "$work/sparse.txt" 2>&1
check "sparse run exits 0" test $? -eq 0
grep "^ffn" "$work/sparse.txt" | head -n 4
check "the tail overflow is logged and the forward redone" grep -q "forward redone" "$work/sparse.txt"
check "sparse loss curve matches dense" compare "$work/sparse/log.jsonl" "$work/dense/log.jsonl" 0.05 40
echo "dense:  $(losses "$work/dense/log.jsonl" | sed -n '1p;10p;20p;30p;40p' | tr '\n' ' ')"
echo "sparse: $(losses "$work/sparse/log.jsonl" | sed -n '1p;10p;20p;30p;40p' | tr '\n' ' ')"

./train_gpt_sparse "${small[@]}" -x 80 -a 0.02 -o "$work/l1_dense" --ffn dense > "$work/l1_dense.txt" 2>&1
check "dense L1 run exits 0" test $? -eq 0
./train_gpt_sparse "${small[@]}" -x 80 -a 0.02 -o "$work/l1_auto" --ffn auto > "$work/l1_auto.txt" 2>&1
check "auto L1 run exits 0" test $? -eq 0
grep "^ffn" "$work/l1_auto.txt" | head -n 6
check "auto turns layers sparse" grep -q -- "-> sparse" "$work/l1_auto.txt"
check "auto loss curve matches dense" compare "$work/l1_auto/log.jsonl" "$work/l1_dense/log.jsonl" 0.05 80

echo "sparse_train: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
