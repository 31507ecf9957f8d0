# Shared by the data-parallel tests (sourced from test_ddp.sh and test_ddp_all.sh):
# the GPU count ($gpus: those CUDA_VISIBLE_DEVICES names, else the machine's; at least the first
# argument or the test skips), a small model's flags, and reading and comparing the train losses of two runs.

if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
fi
if [ "$gpus" -lt "$1" ]; then
    echo "SKIP $TEST_NAME: every test (needs $1 or more GPUs, this machine has $gpus)"
    echo "$TEST_NAME: 0 passed, 0 failed"
    exit 0
fi
export NCCL_NVLS_ENABLE=0
ffn=${FFN:-dense}

# the small model both tests train (its FFN path from $ffn; a constant lambda: the data-parallel checks
# compare losses, which a lambda that grows every step makes drift further apart in bf16)
small=(--layers 2 --dim 128 --heads 4 --kv-heads 2 --hidden 256 -t 128 -u 5 -l 3e-3 -s 0 -m 4 --final-val-batches 4 -a 1e-2 --l1-ramp 0 -x 20 -v 10 -n 10 --ffn "$ffn")
# "step loss" per train step of a run's output directory
losses() { grep '"type":"train"' "$1/log.jsonl" | sed -E 's/.*"step":([0-9]+).*"loss":([-0-9.e+]+).*/\1 \2/'; }
# the largest |a - b| of the losses of the steps both logs have
max_diff() { join <(losses "$1") <(losses "$2") | awk '{d = $2 - $3; if (d < 0) d = -d; if (d > m) m = d} END {printf "%.5f", m + 0}'; }
below() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a < b)}'; }
