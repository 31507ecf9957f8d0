#!/usr/bin/env bash
# Data parallelism on two GPUs (llmc/zero.cuh): a 2-GPU run follows a 1-GPU run
# of the same global batch within bf16 noise; a resume on the same number of
# GPUs is bit-identical and one on another number works (re-sharded optimizer
# state); a killed rank makes the other stop with a clear error within the
# timeout, and the last checkpoint still resumes; SIGTERM stops both ranks at
# the same step with a complete checkpoint. The same resumes with an untied head; with FFN=sparse, hot
# units chosen alike on both GPUs.
set -u
cd "$(dirname "$0")/../.."
TEST_NAME=ddp
. test/check.sh
source test/gpu/ddp_lib.sh 2 # skips with fewer GPUs
echo "ddp: FFN path $ffn"
two() { scripts/launch_local.sh 2 "$@"; }
copy_ckpt() { mkdir -p "$2"; cp "$1"/model_00000010.bin "$1"/state_00000010_* "$1"/log.jsonl "$2/"; }

# 1. the same global batch of 8 x 128 tokens: 1 GPU (one micro-batch of 8, and
# 2 of 4) against 2 GPUs of 4 each
./train_gpt_sparse "${small[@]}" -b 8 -o "$work/one" > "$work/one.txt" 2>&1
check "1-GPU run exits 0" test $? -eq 0
./train_gpt_sparse "${small[@]}" -b 4 -d 1024 -o "$work/acc" > "$work/acc.txt" 2>&1
check "1-GPU run with accumulation exits 0" test $? -eq 0
two "${small[@]}" -b 4 -o "$work/two" > "$work/two.txt" 2>&1
check "2-GPU run exits 0" test $? -eq 0
check "2 processes are announced" grep -q "processes: 2 (from environment), one GPU each" "$work/two.txt"
check "the global batch is announced" grep -q "4 x 128 tokens x 1 accumulation x 2 processes = 1024 tokens per step" "$work/two.txt"
check "2-GPU log has 20 steps" test "$(losses "$work/two" | wc -l)" -eq 20
d_acc=$(max_diff "$work/two" "$work/acc"); d_one=$(max_diff "$work/two" "$work/one")
echo "ddp: max |loss difference| over 20 steps: 2 GPUs vs 1 GPU 2x4: $d_acc, vs 1 GPU 1x8: $d_one"
check "2 GPUs follow 1 GPU with accumulation ($d_acc)" below "$d_acc" 0.01
check "2 GPUs follow 1 GPU with one micro-batch ($d_one)" below "$d_one" 0.02
v_two=$(grep '"type":"val"' "$work/two/log.jsonl" | tail -n 1 | sed -E 's/.*"ce":([-0-9.e+]+).*/\1/')
v_acc=$(grep '"type":"val"' "$work/acc/log.jsonl" | tail -n 1 | sed -E 's/.*"ce":([-0-9.e+]+).*/\1/')
check "validation over the same batches ($v_two vs $v_acc)" below "$(awk -v a="$v_two" -v b="$v_acc" 'BEGIN {d = a - b; print d < 0 ? -d : d}')" 0.01

# 2. resume on 2 GPUs from step 10: bit-identical to the uninterrupted run
copy_ckpt "$work/two" "$work/two_resumed"
check "2-GPU checkpoint has a state file per rank" test -f "$work/two/state_00000010_00001.bin"
two "${small[@]}" -b 4 -o "$work/two_resumed" -y 1 > "$work/two_resumed.txt" 2>&1
check "2-GPU resume exits 0" test $? -eq 0
check "2-GPU resumed log is identical" cmp -s <(strip_timing "$work/two/log.jsonl") <(strip_timing "$work/two_resumed/log.jsonl")
diff <(strip_timing "$work/two/log.jsonl") <(strip_timing "$work/two_resumed/log.jsonl") | head -n 4
check "2-GPU resumed checkpoint is identical" cmp -s "$work/two/model_00000020.bin" "$work/two_resumed/model_00000020.bin"

# 2b. an untied output head (lm_head, a ZeRO bucket of its own): the 2-GPU resume is bit-identical, and the
# checkpoint resumes on 1 GPU (re-sharded)
two "${small[@]}" --untied-head 1 -b 4 -o "$work/untied" > "$work/untied.txt" 2>&1
check "2-GPU run with an untied head exits 0" test $? -eq 0
copy_ckpt "$work/untied" "$work/untied_resumed"
two "${small[@]}" --untied-head 1 -b 4 -o "$work/untied_resumed" -y 1 > "$work/untied_resumed.txt" 2>&1
check "untied head: the 2-GPU resumed log is identical" \
    cmp -s <(strip_timing "$work/untied/log.jsonl") <(strip_timing "$work/untied_resumed/log.jsonl")
check "untied head: the 2-GPU resumed checkpoint is identical" cmp -s "$work/untied/model_00000020.bin" "$work/untied_resumed/model_00000020.bin"
copy_ckpt "$work/untied" "$work/untied_one"
./train_gpt_sparse "${small[@]}" --untied-head 1 -b 4 -d 1024 -o "$work/untied_one" -y 1 > "$work/untied_one.txt" 2>&1
d=$(max_diff "$work/untied_one" "$work/untied")
check "untied head: the 2 -> 1 GPU resume follows the 2-GPU run ($d)" below "$d" 0.01

# 2c. hot units at a fixed rate (FFN=sparse): every process chooses them from the firing counts of all, so
# the 2-GPU run permutes the same units as the 1-GPU run of the same global batch and follows it
if [ "$ffn" = sparse ]; then
    two "${small[@]}" --hot-rate 0.05 -b 4 -o "$work/hot_two" > "$work/hot_two.txt" 2>&1
    check "2-GPU run with hot units exits 0" test $? -eq 0
    check "the 2-GPU run chooses hot units" grep -qE "^ffn: layer [0-9]+ -> split h=" "$work/hot_two.txt"
    ./train_gpt_sparse "${small[@]}" --hot-rate 0.05 -b 4 -d 1024 -o "$work/hot_one" > "$work/hot_one.txt" 2>&1
    check "the 1-GPU run with hot units exits 0" test $? -eq 0
    d=$(max_diff "$work/hot_two" "$work/hot_one")
    echo "ddp: hot units: max |loss difference| over 20 steps, 2 GPUs vs 1 GPU 2x4: $d"
    check "hot units: the 2-GPU run follows the 1-GPU run ($d)" below "$d" 0.01
fi

# 3. across GPU counts: 2 -> 1 and 1 -> 2
copy_ckpt "$work/two" "$work/to_one"
./train_gpt_sparse "${small[@]}" -b 4 -d 1024 -o "$work/to_one" -y 1 > "$work/to_one.txt" 2>&1
check "2-GPU checkpoint resumes on 1 GPU" test $? -eq 0
check "the re-sharding is announced" grep -q "resuming 2 processes' optimizer state on 1: re-sharded" "$work/to_one.txt"
d=$(max_diff "$work/to_one" "$work/two")
check "2 -> 1 GPU resume follows the 2-GPU run ($d)" below "$d" 0.01
copy_ckpt "$work/acc" "$work/to_two"
two "${small[@]}" -b 4 -o "$work/to_two" -y 1 > "$work/to_two.txt" 2>&1
check "1-GPU checkpoint resumes on 2 GPUs" test $? -eq 0
d=$(max_diff "$work/to_two" "$work/acc")
check "1 -> 2 GPU resume follows the 1-GPU run ($d)" below "$d" 0.01
copy_ckpt "$work/two" "$work/wrong_batch"
two "${small[@]}" -b 8 -o "$work/wrong_batch" -y 1 > "$work/wrong_batch.txt" 2>&1 # 2048 tokens per step
check "a resume with another global batch is refused" grep -q "1024 tokens per step .* this run has seq-len 128 and 2048" "$work/wrong_batch.txt"

# 4. a rank dies: the other stops within the timeout with one clear line, and
# the last checkpoint resumes
long=(--layers 2 --dim 128 --heads 4 --kv-heads 2 --hidden 256 -t 128 -b 4 -s 0 -v 0 -m 1 --final-val-batches 1 -n 5 --timeout 15 --ffn "$ffn")
port=$((31000 + RANDOM % 1000))
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 ./train_gpt_sparse "${long[@]}" -x 1000000 -o "$work/dies" --init-address 127.0.0.1:$port > "$work/dies0.txt" 2>&1 &
pid0=$!
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 ./train_gpt_sparse "${long[@]}" -x 1000000 -o "$work/dies" --init-address 127.0.0.1:$port > "$work/dies1.txt" 2>&1 &
pid1=$!
for _ in $(seq 120); do [ -f "$work/dies/state_00000010_00001.bin" ] && break; sleep 0.5; done
kill -9 $pid1
start=$(date +%s)
wait $pid0
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "ddp: rank 0 stopped $elapsed s after rank 1 was killed (exit $rc): $(grep error "$work/dies0.txt" | head -n 1)"
check "rank 0 exits with an error when rank 1 dies" test $rc -ne 0
check "rank 0 stops within the timeout (${elapsed} s)" test "$elapsed" -le 45
check "rank 0 says why" grep -q "did not finish within 15 s: another process of the run died or hangs" "$work/dies0.txt"
# rank 1 may die while the processes write a step's parts: the newest step with both is the last checkpoint
steps=($(ls "$work/dies"/model_*.bin | sed -E 's/.*model_0*([0-9]+)\.bin/\1/' | sort -n))
newest=${steps[-1]}; last=0
for s in "${steps[@]}"; do
    [ -f "$work/dies/$(printf 'state_%08d_00001.bin' "$s")" ] && last=$s
done
if [ "$newest" -ne "$last" ]; then
    two "${long[@]}" -x $((last + 2)) -o "$work/dies" -y 1 > "$work/dies_partial.txt" 2>&1
    check "a resume from the part-written step $newest is refused, naming --resume-step $last" \
        grep -q "step $newest, is incomplete: .*--resume-step $last continues" "$work/dies_partial.txt"
fi
two "${long[@]}" -x $((last + 2)) -o "$work/dies" -y 1 --resume-step "$last" > "$work/dies_resumed.txt" 2>&1
rc=$?
check "the last checkpoint (step $last) resumes on 2 GPUs" test $rc -eq 0
[ $rc -eq 0 ] || tail -n 5 "$work/dies_resumed.txt"

# 5. the other ways to meet give the same run: a shared file, and MPI under
# mpirun (when this build has MPI)
for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r ./train_gpt_sparse "${small[@]}" -b 4 -o "$work/by_file" --init file \
        --init-file "$work/rendezvous" > "$work/by_file$r.txt" 2>&1 &
done
wait
check "processes meeting through a file train the same steps" cmp -s <(strip_timing "$work/two/log.jsonl") <(strip_timing "$work/by_file/log.jsonl")
check "the rendezvous file is removed" test ! -e "$work/rendezvous"
if mpicc --showme:compile > /dev/null 2>&1 && command -v mpirun > /dev/null; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 scripts/launch_mpi.sh 2 "${small[@]}" -b 4 -o "$work/by_mpi" > "$work/by_mpi.txt" 2>&1
    check "mpirun starts 2 processes that meet through MPI" grep -q "processes: 2 (from mpirun (Open MPI))" "$work/by_mpi.txt"
    check "processes meeting through MPI train the same steps" cmp -s <(strip_timing "$work/two/log.jsonl") <(strip_timing "$work/by_mpi/log.jsonl")
    [ -f "$work/by_mpi/log.jsonl" ] || tail -n 5 "$work/by_mpi.txt"
else
    echo "SKIP ddp: the MPI launch (no Open MPI here)"
fi

# 6. two processes with no way to meet: one line, not a hang
RANK=0 WORLD_SIZE=2 ./train_gpt_sparse "${small[@]}" -o "$work/alone" > "$work/alone.txt" 2>&1
check "no rendezvous given is an error" grep -q "2 processes (from environment) but no way for them to meet" "$work/alone.txt"

# 7. a stop: SIGTERM to the launcher, which passes it on once; both processes stop after the same step
# with their parts of one checkpoint, and the continued run repeats the uninterrupted one bit for bit.
# SIGTERM to one process only: the other stops at the same step too (the flag is all-reduced each step)
stopargs=(--layers 2 --dim 128 --heads 4 --kv-heads 2 --hidden 256 -t 128 -b 4 -u 5 -l 3e-3 -s 0 -m 4 --final-val-batches 4 -a 1e-2
          -v 500 -n 500 -x 2000 --ffn "$ffn")
# (hot units at a fixed rate: costs measured on the GPU differ between runs, and so would the hot sets)
[ "$ffn" = dense ] || stopargs+=(--hot-rate 0.05)
source test/train_lib.sh
two "${stopargs[@]}" -o "$work/stop_ref" > "$work/stop_ref.txt" 2>&1
check "uninterrupted 2-GPU run of 2000 steps exits 0" test $? -eq 0
scripts/launch_local.sh 2 "${stopargs[@]}" -o "$work/stopped" > "$work/stopped.txt" 2>&1 &
stop_at "$work/stopped" 50 $! TERM
check "SIGTERM: the 2-GPU run ends by the signal (exit $rc)" test $rc -eq 143
stop=$(sed -n 's/^stopped at step \([0-9]*\) of 2000 (SIGTERM): the checkpoint is .*/\1/p' "$work/stopped.txt")
check "SIGTERM: rank 0 says where the checkpoint is (step ${stop:-none})" test -n "$stop"
stop=${stop:-0}
check "SIGTERM: both processes wrote their part of step $stop" \
    test -f "$work/stopped/$(printf 'state_%08d_00000.bin' "$stop")" -a -f "$work/stopped/$(printf 'state_%08d_00001.bin' "$stop")"
two "${stopargs[@]}" -o "$work/stopped" -y 1 > "$work/stopped2.txt" 2>&1
check "SIGTERM: the continued 2-GPU run exits 0" test $? -eq 0
check "SIGTERM: continued, the log equals the uninterrupted run's" \
    cmp -s <(strip_timing "$work/stop_ref/log.jsonl") <(strip_timing "$work/stopped/log.jsonl")
check "SIGTERM: continued, the last checkpoint equals the uninterrupted run's" \
    cmp -s "$work/stop_ref/model_00002000.bin" "$work/stopped/model_00002000.bin"
port=$((32000 + RANDOM % 1000))
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 ./train_gpt_sparse "${stopargs[@]}" -o "$work/one_signal" --init-address 127.0.0.1:$port > "$work/one_signal0.txt" 2>&1 &
pid0=$!
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 ./train_gpt_sparse "${stopargs[@]}" -o "$work/one_signal" --init-address 127.0.0.1:$port > "$work/one_signal1.txt" 2>&1 &
pid1=$!
wait_for_step "$work/one_signal" 50 $pid0
kill -TERM $pid1
wait $pid1; rc1=$?
wait $pid0; rc0=$?
check "SIGTERM to rank 1 only: it ends by the signal (exit $rc1)" test $rc1 -eq 143
check "... and rank 0 stops with an error (exit $rc0)" test $rc0 -eq 1
stop=$(sed -n 's/^stopped at step \([0-9]*\) of 2000 (another process was asked to stop): the checkpoint is .*/\1/p' "$work/one_signal0.txt")
check "... at a step of which both wrote their part (step ${stop:-none})" test -n "$stop" -a \
    -f "$work/one_signal/$(printf 'state_%08d_00000.bin' "${stop:-0}")" -a -f "$work/one_signal/$(printf 'state_%08d_00001.bin' "${stop:-0}")"

finish
