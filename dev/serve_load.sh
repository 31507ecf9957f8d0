#!/usr/bin/env bash
# `infer --serve` under load on the CPU path: a tiny model (test/serve_lib.sh), REQUESTS requests from
# CLIENTS clients at once on 127.0.0.1, a third of them bad (malformed, out of range, too large, unknown
# routes, bodies cut off, streams dropped after their first event); every good one greedy and compared
# with what infer gives for its prompt alone. Prints the answers lost (none came) and garbled (not whole,
# or not infer's text), and the server's resident memory every 100 requests; ends with status 1 if any was
# lost or garbled, or if the memory grew by more than 16 MB after the first 200 requests. The figures of
# dev/RESULTS.md ("Serving"). Needs node >= 18.
#   bash dev/serve_load.sh [REQUESTS (1000)] [CLIENTS (32)]
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-1000}
clients=${2:-32}
work=$(mktemp -d /tmp/serve_load_XXXXXX)
trap 'kill $pid 2> /dev/null || true; rm -rf "$work"' EXIT # (the server may be gone: not an error)
pid=0
. test/serve_lib.sh
tiny_model "$work/m"
start_server load -m "$model" --device cpu --slots 8 --queue 256 --chunk 16 --max-tokens 200 --max-body 4096 --timeout 120
echo "server: $(grep '^serving' "$work/load.log")"
status=0
node dev/serve_client.mjs load "$url" requests="$requests" clients="$clients" pid="$pid" max_body=4096 infer=./infer \
    model="$model" cache="$work/expected.json" || status=1
stop_server
echo "server: exit status $rc on SIGTERM; $(curl -s --max-time 5 "$url/health" > /dev/null && echo still up || echo gone)"
[ "$rc" -eq 0 ] || status=1
exit $status
