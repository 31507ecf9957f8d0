#!/usr/bin/env bash
# The paper's TwELL kernels beside ours on the same inputs (docs/SPARSE.md, benchmark conventions): runs
# build/dev/bench_twell with BENCH_DUMP for uniform k=30, realistic k=30 and, with `trained MODEL [LAYER]`,
# that layer of a checkpoint, then dev/bench_twell_reference.py on the dumps with the reference built from
# CHECKOUT, a checkout of github.com/SakanaAI/sparser-faster-llms kept outside this repository's history.
# Needs a Hopper GPU, nvcc, python3 with torch and ninja. The dumps take about 200 MB a pattern at the
# standard point, in $BENCH_DUMP (default /tmp/bench_twell_dump); ITERS sets the runs (20).
# usage: bash dev/bench_twell_reference.sh CHECKOUT [M D H] [trained MODEL [LAYER]]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: bash dev/bench_twell_reference.sh CHECKOUT [M D H] [trained MODEL [LAYER]]" >&2
    exit 1
fi
checkout=$1
shift
if [ ! -f "$checkout/custom_models/twell_modules/twell.py" ]; then
    echo "bench_twell_reference: $checkout/custom_models/twell_modules/twell.py not found (a sparser-faster-llms checkout)" >&2
    exit 1
fi
shape=""
if [ $# -ge 3 ] && [[ $1 =~ ^[0-9]+$ && $2 =~ ^[0-9]+$ && $3 =~ ^[0-9]+$ ]]; then
    shape="$1 $2 $3"
    shift 3
fi
trained=()
if [ $# -ge 2 ] && [ "$1" = trained ]; then
    trained=("$@")
elif [ $# -gt 0 ]; then
    echo "bench_twell_reference: \"$*\" is neither M D H nor trained MODEL [LAYER]" >&2
    exit 1
fi
dump=${BENCH_DUMP:-/tmp/bench_twell_dump}
iters=${ITERS:-20}

make -j"$(nproc)" build/dev/bench_twell GPU_ARCH="-gencode arch=compute_90a,code=sm_90a"
# (a pattern counts where its meta.json is: none is left from an earlier run)
mkdir -p "$dump"
rm -f "$dump"/*/meta.json
# one process a pattern: BENCH_ONLY names one
for pattern in "uniform k=30" "realistic k=30"; do
    BENCH_SHAPE="$shape" BENCH_DUMP="$dump" BENCH_ONLY="$pattern" build/dev/bench_twell "$iters"
done
if [ ${#trained[@]} -gt 0 ]; then
    BENCH_SHAPE="$shape" BENCH_DUMP="$dump" BENCH_ONLY=trained build/dev/bench_twell "$iters" "${trained[@]}"
fi
PYTHONUNBUFFERED=1 python3 dev/bench_twell_reference.py "$checkout" "$dump" --iters "$iters"
