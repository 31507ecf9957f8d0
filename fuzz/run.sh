#!/usr/bin/env bash
# Runs every named libFuzzer harness and prints a line for each, then a total;
# a crash prints its report and where its input was saved, the other harnesses still run, and the
# exit status is 1 if any crashed.
#   bash fuzz/run.sh [-j JOBS] -t SECONDS [-s SEED] NAME...   a search (make fuzz)
#   bash fuzz/run.sh [-j JOBS] -n RUNS -s SEED NAME...        a check that repeats itself (make fuzz-ci)
# -t: SECONDS per harness (build/fuzz/fuzz_NAME) with libFuzzer's random seed (or SEED), on the corpus
#     build/fuzz/corpus/NAME, which grows from run to run, started from build/fuzz/seeds/NAME and
#     fuzz/regressions/NAME.
# -n: RUNS inputs per harness (build/fuzz-ci/fuzz_NAME: without the stack-depth feature, see the
#     Makefile) from SEED, started from the seeds and regressions alone (a scratch corpus), without
#     libFuzzer's comparison-guided mutations: those take their values from every comparison the code
#     makes, pointers' too, which differ from process to process (ASLR). So the same commit, built by
#     the same clang, gives the same inputs and the same verdict every time.
# -j: harnesses run JOBS at a time (each on one core).
set -u
cd "$(dirname "$0")/.."
jobs=1 seconds="" runs="" seed=0
while getopts "j:t:n:s:" opt; do
    case $opt in
        j) jobs=$OPTARG ;;
        t) seconds=$OPTARG ;;
        n) runs=$OPTARG ;;
        s) seed=$OPTARG ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
# (-n needs a seed of its own: 0 asks libFuzzer for a random one)
if [ -z "$seconds$runs" ] || { [ -n "$seconds" ] && [ -n "$runs" ]; } || { [ -n "$runs" ] && [ "$seed" = 0 ]; } ||
    [ $# -eq 0 ]; then
    echo "usage: bash fuzz/run.sh [-j JOBS] (-t SECONDS [-s SEED] | -n RUNS -s SEED) NAME..." >&2
    exit 2
fi
mkdir -p build/fuzz/crashes

# one harness: its line (and a crash's report) on stdout; status 1 if it crashed
run_one() {
    local name=$1 bin corpus args
    if [ -n "$runs" ]; then
        bin="build/fuzz-ci/fuzz_$name"
        corpus="build/fuzz/scratch/$name"
        rm -rf "$corpus"
        args=(-runs="$runs" -reload=0 -use_cmp=0)
    else
        bin="build/fuzz/fuzz_$name"
        corpus="build/fuzz/corpus/$name"
        args=(-max_total_time="$seconds")
    fi
    mkdir -p "$corpus"
    local dirs=("$corpus" "build/fuzz/seeds/$name")
    [ -d "fuzz/regressions/$name" ] && dirs+=("fuzz/regressions/$name")
    local log="build/fuzz/$name.log" start=$SECONDS
    # -close_fd_mask=3: the harness's error lines stay out of the log (libFuzzer keeps its own);
    # -timeout: an input that takes 10 s is a finding (the parsers are linear)
    "$bin" "${args[@]}" -seed="$seed" -timeout=10 -close_fd_mask=3 -print_final_stats=1 \
        -artifact_prefix="build/fuzz/crashes/$name-" "${dirs[@]}" >"$log" 2>&1
    local rc=$? took=$((SECONDS - start))
    local used ran
    used=$(sed -n 's/^INFO: Seed: //p' "$log" | head -n 1)
    ran=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ $rc -ne 0 ]; then
        tail -n 60 "$log"
        echo "fuzz_$name: seed ${used:-?}, CRASHED after ${ran:-?} runs in $took s (rc $rc): the input is in" \
             "build/fuzz/crashes/, the log in $log"
        return 1
    fi
    echo "fuzz_$name: seed ${used:-?}, $took s, ${ran:-?} runs, 0 crashes, corpus $(ls "$corpus" | wc -l) inputs"
}

# JOBS at a time; the lines come in the order of the names
names=("$@") pids=() crashed=()
report() {
    wait "${pids[$1]}" || crashed+=("${names[$1]}")
    cat "build/fuzz/${names[$1]}.result"
}
reported=0
for i in "${!names[@]}"; do
    if [ $((i - reported)) -ge "$jobs" ]; then report $reported; reported=$((reported + 1)); fi
    run_one "${names[$i]}" > "build/fuzz/${names[$i]}.result" 2>&1 &
    pids[$i]=$!
done
for ((; reported < ${#names[@]}; reported++)); do report $reported; done
if [ ${#crashed[@]} -gt 0 ]; then
    echo "fuzz: ${#crashed[@]} of ${#names[@]} harnesses crashed: ${crashed[*]}"
    exit 1
fi
echo "fuzz: ${#names[@]} harnesses, 0 crashes"
