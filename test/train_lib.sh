# Sourced by the tests that stop training runs (test/test_signals.sh, test/gpu/test_ddp.sh):
# waiting for a run in the background to reach a step, and stopping it there.

# the step of the last train line of a log, 0 if none
last_step() {
    local s
    s=$(grep -o '"type":"train","step":[0-9]*' "$1" 2> /dev/null | tail -n 1 | grep -o '[0-9]*$')
    echo "${s:-0}"
}

# wait_for_step DIR STEP PID: until the run in DIR logged STEP (0), or its process PID ended or 120 s
# passed (1)
wait_for_step() {
    for _ in $(seq 2400); do
        [ "$(last_step "$1/log.jsonl")" -ge "$2" ] && return 0
        kill -0 "$3" 2> /dev/null || return 1
        sleep 0.05
    done
    return 1
}

# stop_at DIR STEP PID SIGNAL: once the run logged STEP, sends it SIGNAL and waits for it; its exit status in rc
stop_at() {
    wait_for_step "$1" "$2" "$3"
    kill "-$4" "$3"
    wait "$3"
    rc=$?
}
