#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: build, GPU tests, the check
# against Hugging Face, benchmarks. Logs go to $OUT (the device tool brings them
# back). usage: bash dev/gpu.sh [test] [hf] [bench] [pytorch] [ddp]   (default: all
# but ddp, which needs 2 GPUs: data-parallel scaling at the 1.5B shape)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
stages=${*:-test hf bench pytorch}
has() { [[ " $stages " == *" $1 "* ]]; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
make -j16 all gpu > "$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
grep -E "warning" "$OUT/build.log" | head -n 20

if has test; then
    make test-gpu 2>&1 | tee "$OUT/test_gpu.log" | tail -n 60
    build/gpu/test_model_gpu > "$OUT/test_model_gpu.log" 2>&1
fi
if has hf; then
    mkdir -p /tmp/hf && build/dev/hf_reference /tmp/hf && python3 dev/compare_hf.py /tmp/hf 2>&1 | tee "$OUT/compare_hf.log" | tail -n 40
fi
if has bench; then
    {
        build/dev/bench_attention 20
        build/dev/bench_model 124m 16 1024 10
        build/dev/bench_model 1.5b 4 2048 5
    } 2>&1 | tee "$OUT/bench.log"
fi
if has ddp; then
    for ffn in dense sparse; do
        echo "FFN $ffn:"
        bash dev/bench_ddp.sh "1 2" -e 1.5b -b 4 -t 2048 --ffn $ffn
    done 2>&1 | tee "$OUT/bench_ddp.log"
fi
if has pytorch; then
    {
        python3 dev/bench_pytorch.py 124m 16 1024 10
        python3 dev/bench_pytorch.py 1.5b 4 2048 5
    } 2>&1 | grep -vE "Warning|warn" | tee "$OUT/bench_pytorch.log"
fi
