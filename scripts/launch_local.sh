#!/usr/bin/env bash
# Data-parallel training on the GPUs of this machine: one process per GPU, which
# meet over TCP on localhost (no MPI needed).
#   usage: scripts/launch_local.sh NUM_GPUS [train_gpt_sparse flags...]
#   e.g.   scripts/launch_local.sh 8 -e 1.5b -b 4 -t 2048 -d 524288 -i "fineweb/*train*.bin" -j "fineweb/*val*.bin"
# If a process fails, the others are stopped at once and the script exits with its
# status. Ctrl-C or SIGTERM is passed on once to every process: each finishes its
# step and writes its share of a checkpoint (a second one stops them at once).
set -u
if [ $# -lt 1 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 NUM_GPUS [train_gpt_sparse flags...]" >&2
    exit 2
fi
n=$1; shift
cd "$(dirname "$0")/.."
port=${PORT:-$((29500 + RANDOM % 2000))}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} # NVLink multicast off (see README)
pids=()
for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r ./train_gpt_sparse --init tcp --init-address "127.0.0.1:$port" "$@" &
    pids+=($!)
done
stopping=0
# the first signal is passed on; a second one too, which stops the processes at once
trap 'stopping=1; kill -TERM "${pids[@]}" 2>/dev/null' INT TERM
status=0
left=$n
while [ $left -gt 0 ]; do
    wait -n
    rc=$?
    gone=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || gone=$((gone + 1)); done
    [ $gone -gt $((n - left)) ] || continue # the wait was cut short by a signal, no process ended
    left=$((left - 1))
    if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
        status=$rc
        # a process that failed leaves the others waiting in a collective: end them (a stop lets them finish)
        [ $stopping -eq 1 ] || kill -KILL "${pids[@]}" 2>/dev/null
    fi
done
exit $status
