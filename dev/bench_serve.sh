#!/usr/bin/env bash
# The server's load benchmark on 127.0.0.1: STREAMS concurrent streams, each sending requests one after
# the other (prompts of PROMPT tokens, MAX_TOKENS greedy tokens each), against `infer --serve` with
# --ffn dense and with --ffn twell (the sparse decode) on the same model; on a GPU machine also Hugging
# Face `generate` at the same batch (--hf DIR: the model exported by hf_convert --export), the baseline a
# user would otherwise pick. Prints one JSON line per run: requests/s, output tok/s, time to first token
# and time per output token (the mean gap of a request's tokens after its first) at p50 and p99, and the
# gap between two tokens at p50 and p99; then the ratios. On the CPU path one run (it is dense).
#   bash dev/bench_serve.sh [-m MODEL] [--streams 16] [--prompt 512] [--max-tokens 256] [--requests N]
#                           [--chunk 512] [--hf DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
model=out; streams=16; prompt=512; max_tokens=256; requests=""; chunk=512; hf=""
while [ $# -gt 0 ]; do
    case "$1" in
        -m) model=$2; shift 2 ;;
        --streams) streams=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --max-tokens) max_tokens=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --chunk) chunk=$2; shift 2 ;;
        --hf) hf=$2; shift 2 ;;
        *) echo "unknown flag $1 (see the top of $0)"; exit 1 ;;
    esac
done
requests=${requests:-$((streams * 4))}
work=$(mktemp -d /tmp/bench_serve_XXXXXX)
pid=0
trap 'kill $pid 2> /dev/null || true; rm -rf "$work"' EXIT # (the server may be gone: not an error)
. test/serve_lib.sh
# the load client is Node's: the machine's, else a copy packed into .deps/node.xz (`xz -c "$(command -v node)" >
# .deps/node.xz` where Node is installed) for a machine without it, such as the GPU machine
node=$(command -v node || true)
if [ -z "$node" ] && [ -f .deps/node.xz ]; then
    xz -dc .deps/node.xz > "$work/node" && chmod +x "$work/node" && node="$work/node"
fi
[ -n "$node" ] || { echo "error: the load client needs Node.js: apt-get install nodejs, or carry .deps/node.xz (above)"; exit 1; }
gpu=0
command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && gpu=1
paths=(cpu)
[ $gpu -eq 1 ] && paths=(dense twell)
for ffn in "${paths[@]}"; do
    ffn_flag=(); [ "$ffn" != cpu ] && ffn_flag=(--ffn "$ffn")
    start_server "$ffn" -m "$model" "${ffn_flag[@]}" --slots "$streams" --chunk "$chunk" --max-tokens "$max_tokens" \
        --queue $((requests + streams))
    "$node" dev/serve_client.mjs bench "$url" streams="$streams" prompt="$prompt" max_tokens="$max_tokens" \
        requests="$requests" label="server $ffn" | tee -a "$work/results.jsonl"
    curl -s --max-time 10 "$url/metrics" | grep -E "^serve_(ffn_active_units_per_token|decode_(steps|rows)_total)" \
        > "$work/$ffn.metrics" || true
    echo "  $(awk '/decode_steps/ {s = $2} /decode_rows/ {r = $2} END {if (s) printf "mean decode batch %.1f; ", r / s}' \
        "$work/$ffn.metrics")FFN units per token: $(awk -F'[ "]' '/active_units/ {printf "%s ", $NF}' "$work/$ffn.metrics")"
    stop_server
done
if [ -n "$hf" ]; then
    python3 dev/bench_hf_generate.py "$hf" --batch "$streams" --prompt "$prompt" --max-tokens "$max_tokens" |
        tee -a "$work/results.jsonl"
fi
"$node" -e '
    const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
    const by = Object.fromEntries(rows.map((r) => [r.label, r]));
    const s = by["server twell"], d = by["server dense"], h = by["hf generate"];
    if (s && d) console.log(`sparse / dense server: output tok/s ${(s.output_tok_per_s / d.output_tok_per_s).toFixed(2)}x, ` +
        `p99 time per output token ${(s.tpot_ms_p99 / d.tpot_ms_p99).toFixed(2)}x`);
    if (s && h) console.log(`sparse server / HF generate at batch ${h.batch}: output tok/s ` +
        `${(s.output_tok_per_s / h.output_tok_per_s).toFixed(2)}x; p99 time per output token / HF decode step ` +
        `${(s.tpot_ms_p99 / h.step_ms).toFixed(2)}x`);' "$work/results.jsonl"
