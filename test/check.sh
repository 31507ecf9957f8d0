# Sourced by the shell tests once they are in the repository's root, with TEST_NAME set:
#   check "what" command...   runs the command: a pass, or a failure printed as "FAIL TEST_NAME: what"
#   finish                    prints "TEST_NAME: N passed, M failed" (test/run_tests.sh adds these up)
#                             and returns non-zero after a failure
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
work=$(mktemp -d "/tmp/test_${TEST_NAME}_XXXXXX")
trap 'rm -rf "$work"' EXIT
