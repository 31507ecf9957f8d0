#!/usr/bin/env bash
# `infer --serve` end to end on the CPU path, on a tiny model (test/serve_lib.sh), on 127.0.0.1 and
# ports the server picks: curl and the official openai package (Node) against it, greedy completions
# compared with what `infer` gives for the same prompt alone, 32 clients at once, every kind of bad
# request, a full queue, a slow client, clients that vanish mid-stream, and a clean stop on SIGTERM.
# The clients are dev/serve_client.mjs's; without curl, Node or the openai package those parts skip.
set -u
cd "$(dirname "$0")/.."
TEST_NAME=serve
. test/check.sh

if ./infer --serve -m "$work/none.bin" 2>&1 | grep -q "needs libmicrohttpd"; then
    echo "SKIP test_serve: all (this infer was built without libmicrohttpd: apt-get install libmicrohttpd-dev)"
    finish
    exit $?
fi
expect_error "--serve takes its prompts and sampling settings per request: drop --prompt" ./infer --serve -p hi
expect_error "--slots needs --serve" ./infer --slots 2 -p hi

. test/serve_lib.sh
tiny_model "$work/m"
check "the tiny model is made" test -f "$model"

start_server main -m "$model" --device cpu --slots 4 --queue 64 --chunk 16 --max-tokens 200 --max-body 4096 --timeout 120
check "the server starts and says where" test -n "$url"
node_ok=0
command -v node > /dev/null && node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' && node_ok=1
client() { node dev/serve_client.mjs "$1" "$url" infer=./infer model="$model" cache="$work/expected.json" "${@:2}"; }

if command -v curl > /dev/null; then
    curl -s --max-time 30 "$url/health" > "$work/health.json"
    check "curl: /health" grep -q '"status":"ok"' "$work/health.json"
    curl -s --max-time 30 "$url/v1/models" > "$work/models.json"
    check "curl: /v1/models names the model" grep -q '"id":"model_00000001"' "$work/models.json"
    curl -s --max-time 60 "$url/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"model_00000001","prompt":"The sea","max_tokens":12,"temperature":0}' > "$work/c.json"
    ./infer -m "$model" --device cpu -p "The sea" -n 12 -t 0 -q 1 > "$work/infer.txt" 2>&1
    if [ $node_ok -eq 1 ]; then
        check "curl: the completion is infer's text" node -e '
            const fs = require("fs"), c = JSON.parse(fs.readFileSync(process.argv[1]));
            const want = fs.readFileSync(process.argv[2]).toString("utf8").replace(/\n$/, "");
            process.exit(c.object === "text_completion" && c.choices[0].text === want && c.usage.total_tokens ===
                c.usage.prompt_tokens + c.usage.completion_tokens ? 0 : 1)' "$work/c.json" "$work/infer.txt"
    fi
    curl -s -N --max-time 60 "$url/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"The sea","max_tokens":12,"temperature":0,"stream":true}' > "$work/stream.txt"
    check "curl: a stream of events ends with [DONE]" bash -c '[ "$(tail -n 2 "$1" | head -n 1)" = "data: [DONE]" ] &&
        grep -q "\"finish_reason\":\"\(length\|stop\)\"" "$1"' _ "$work/stream.txt"
    status=$(curl -s -o "$work/e.json" -w '%{http_code}' --max-time 30 "$url/v1/completions" -d '{"prompt": "x",}')
    check "curl: malformed JSON: 400 and an OpenAI error" bash -c '[ "$0" = 400 ] && grep -q "\"type\":\"invalid_request_error\"" "$1"' "$status" "$work/e.json"
    status=$(curl -s -o "$work/e.json" -w '%{http_code}' --max-time 30 "$url/nowhere")
    check "curl: an unknown route: 404" bash -c '[ "$0" = 404 ] && grep -q "\"code\":\"not_found\"" "$1"' "$status" "$work/e.json"
    head -c 5000 /dev/zero | tr '\0' x > "$work/big.txt"
    status=$(curl -s -o "$work/e.json" -w '%{http_code}' --max-time 30 "$url/v1/completions" --data-binary @"$work/big.txt")
    check "curl: a body over --max-body: 413" bash -c '[ "$0" = 413 ] && grep -q "\"code\":\"request_too_large\"" "$1"' "$status" "$work/e.json"
else
    echo "SKIP test_serve: the curl checks (no curl)"
fi

if [ $node_ok -eq 1 ]; then
    check "the openai package (Node)" client openai npm=build/npm-serve id=model_00000001
    check "32 clients at once, each greedy text as infer's alone" client concurrent n=32
    check "every kind of bad request gets its status; the server goes on" client bad max_body=4096
    check "clients that leave mid-stream free their slots" client disconnect n=4
    check "a small load with bad requests: none lost or garbled" client load requests=120 clients=16 pid=$pid
else
    echo "SKIP test_serve: the Node clients (no node >= 18)"
fi
check "/metrics: Prometheus text with the FFN's firing per layer" bash -c 'curl -s --max-time 30 "$0/metrics" |
    grep -q "^serve_ffn_active_units_per_token{layer=\"1\"} [0-9.e+-]*$"' "$url"

# SIGTERM while a stream runs: the stream completes, then the server exits 0
[ $node_ok -eq 1 ] && check "SIGTERM: the stream running then completes" client drain pid=$pid
stop_server
check "SIGTERM: the server exits 0" test "$rc" -eq 0
check "SIGTERM: it says it stopped" grep -q "^stopped" "$work/main.log"

# a server of 1 slot and a queue of 1: 429 at once; one with a 1 s timeout: 408 for a slow body
if [ $node_ok -eq 1 ]; then
    start_server small -m "$model" --device cpu --slots 1 --queue 1 --max-tokens 40
    check "a full queue: 429 at once" client queue n=24 max_tokens=40
    stop_server
    start_server slow -m "$model" --device cpu --timeout 1
    check "a body slower than --timeout: 408" client slow seconds=2.5
    stop_server
    check "the small servers exit 0" test "$rc" -eq 0
fi
finish
