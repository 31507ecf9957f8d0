# Sourced by the shell tests once they are in the repository's root, with TEST_NAME set:
#   check "what" command...   runs the command: a pass, or a failure printed as "FAIL TEST_NAME: what"
#   finish                    prints "TEST_NAME: N passed, M failed" (test/run_tests.sh adds these up)
#                             and returns non-zero after a failure
#   expect_error "text" command...   checks that the command fails with one line on stderr holding text
#   json_field LOG TYPE KEY   the KEY values of a log.jsonl's lines of that type, one per line
#   strip_timing LOG          a log.jsonl without the fields that differ from run to run (times, MFU, memory)
# and $work, a private temporary directory, removed at exit.
passed=0; failed=0
check() {
    local what=$1; shift
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL $TEST_NAME: $what"; fi
}
finish() {
    echo "$TEST_NAME: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
expect_error() {
    local want=$1; shift
    local out; out=$("$@" 2>&1 >/dev/null); local rc=$?
    check "error '$want'" bash -c '[ "$0" -ne 0 ] && [ "$(printf "%s\n" "$1" | wc -l)" -eq 1 ] && [[ "$1" == *"$2"* ]] || { echo "got ($0): $1"; false; }' "$rc" "$out" "$want"
}
json_field() { grep "\"type\":\"$2\"" "$1" | sed -E "s/.*\"$3\":([-0-9.e+]+).*/\1/"; }
strip_timing() { sed -E 's/,"tok_per_s":[^,]*,"ms":[^,]*//; s/,"mfu":[^,]*,"mem_gib":[^,]*//' "$1"; }
work=$(mktemp -d "/tmp/test_${TEST_NAME}_XXXXXX")
trap 'rm -rf "$work"' EXIT
