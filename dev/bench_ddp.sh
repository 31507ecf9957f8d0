#!/usr/bin/env bash
# Data-parallel scaling of train_gpt_sparse: training tok/s on 1, 2, ... GPUs of
# this machine with the same micro-batch per GPU (so N GPUs train N times the
# tokens per step), and the speedup over one GPU.
#   usage: bash dev/bench_ddp.sh "1 2" [train_gpt_sparse flags...]
#   e.g.   bash dev/bench_ddp.sh "1 2" -e 1.5b -b 4 -t 2048
# Timing: the median ms of the steps after the first 3 (warm-up), from log.jsonl; STEPS (12) and SKIP (3)
# set the steps run and skipped (--ffn auto re-chooses its paths every 10 steps: a run of 40 skipping 25
# times the paths it settles on). Each run's last line of FFN paths follows its row.
set -u
cd "$(dirname "$0")/.."
counts=$1; shift
export NCCL_NVLS_ENABLE=0
steps=${STEPS:-12}
skip=${SKIP:-3}
work=$(mktemp -d /tmp/bench_ddp_XXXXXX)
trap 'rm -rf "$work"' EXIT
median_ms() {
    grep '"type":"train"' "$1/log.jsonl" | sed -E 's/.*"step":([0-9]+).*"ms":([0-9.e+]+).*/\1 \2/' |
        awk -v skip="$skip" '$1 > skip {print $2}' | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
printf "%-6s %12s %14s %10s %10s\n" GPUs "ms/step" "tok/s" speedup "mem GiB"
base=""
for n in $counts; do
    out="$work/n$n"
    if ! scripts/launch_local.sh "$n" "$@" -x $steps -v 0 -m 1 -n -1 -s 0 -o "$out" > "$out.txt" 2>&1; then
        echo "$n GPUs: run failed"; tail -n 5 "$out.txt"; continue
    fi
    tokens=$(sed -nE 's/.*= ([0-9]+) tokens per step.*/\1/p' "$out.txt" | head -n 1)
    ms=$(median_ms "$out")
    mem=$(grep '"type":"train"' "$out/log.jsonl" | tail -n 1 | sed -E 's/.*"mem_gib":([0-9.]+).*/\1/')
    tps=$(awk -v t="$tokens" -v ms="$ms" 'BEGIN {printf "%.0f", t / ms * 1000}')
    [ -z "$base" ] && base=$tps
    printf "%-6s %12.1f %14s %10.3f %10s\n" "$n" "$ms" "$tps" "$(awk -v a="$tps" -v b="$base" 'BEGIN {print a / b}')" "$mem"
    grep "^ffn path per layer" "$out.txt" | tail -n 1 | sed 's/^/       /'
done
