# Sourced by test/test_serve.sh and the server's dev scripts (dev/serve_load.sh, dev/bench_serve.sh), from
# the repository's root, with $work a temporary directory:
#   tiny_model DIR          a tiny model as initialised (2 layers, D 64, 256 tokens of context) into DIR;
#                           its path in $model (a step at learning rate 0: its greedy text follows the prompt
#                           closely, where a model trained briefly repeats one token)
#   start_server NAME ARGS  ./infer --serve ARGS on a free port of 127.0.0.1 in the background, its output in
#                           $work/NAME.log; sets $url and $pid (returns 1, with the log, if it does not start)
#   stop_server             SIGTERM, waits (60 s, then SIGKILL); the exit status in $rc (124: killed)

tiny_model() {
    ./train_gpt_sparse --layers 2 --dim 64 --heads 4 --kv-heads 2 -t 256 --hidden 128 -s 0 -x 1 -l 0 -a 0 -v 0 -m 1 \
        -n 0 -b 1 -o "$1" > "$1.log" 2>&1
    model="$1/model_00000001.bin"
}

start_server() {
    local name=$1; shift
    ./infer --serve --port 0 "$@" > "$work/$name.log" 2>&1 &
    pid=$!
    url=""
    for _ in $(seq 600); do
        url=$(sed -n 's/^serving .* on \(http:\/\/[0-9.]*:[0-9]*\):.*/\1/p' "$work/$name.log")
        [ -n "$url" ] && return 0
        kill -0 $pid 2> /dev/null || break
        sleep 0.1
    done
    echo "the server $name did not start:"; cat "$work/$name.log"
    return 1
}

stop_server() {
    kill -TERM $pid
    for _ in $(seq 600); do kill -0 $pid 2> /dev/null || break; sleep 0.1; done
    if kill -0 $pid 2> /dev/null; then kill -KILL $pid; wait $pid; rc=124; else wait $pid; rc=$?; fi
}
