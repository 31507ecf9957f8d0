#!/usr/bin/env bash
# Runs each named libFuzzer harness (build/fuzz/fuzz_NAME) for SECONDS on its corpus
# build/fuzz/corpus/NAME, started from build/fuzz/seeds/NAME and fuzz/regressions/NAME;
# prints one line per harness, or the report and the saved input of a crash (then exits 1).
#   bash fuzz/run.sh SECONDS NAME...
set -u
cd "$(dirname "$0")/.."
seconds=$1; shift
mkdir -p build/fuzz/crashes
for name in "$@"; do
    mkdir -p "build/fuzz/corpus/$name"
    dirs=("build/fuzz/corpus/$name" "build/fuzz/seeds/$name")
    [ -d "fuzz/regressions/$name" ] && dirs+=("fuzz/regressions/$name")
    log="build/fuzz/$name.log"
    # -close_fd_mask=3: the harness's error lines stay off the terminal (libFuzzer keeps its own);
    # -timeout: an input that takes 10 s is a finding (the parsers are linear)
    "build/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -close_fd_mask=3 -print_final_stats=1 \
        -artifact_prefix="build/fuzz/crashes/$name-" "${dirs[@]}" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ $rc -ne 0 ]; then
        tail -n 60 "$log"
        echo "fuzz_$name: crashed after ${runs:-?} runs (rc $rc); the input is in build/fuzz/crashes/, the log in $log"
        exit 1
    fi
    echo "fuzz_$name: $seconds s, ${runs:-?} runs, 0 crashes, corpus $(ls "build/fuzz/corpus/$name" | wc -l) inputs"
done
