#!/usr/bin/env bash
# Runs every test (binary or script) given on the command line, adds up their
# "N passed, M failed" lines and prints the total (after a test with failures,
# its last 30 lines of output). A test that leaves part of
# itself out (a tool or a GPU missing) says so in a line "SKIP <test>: <what>
# (<why>)"; each such line counts as one skipped, and the list ends the output.
set -u
cd "$(dirname "$0")/.."
passed=0; failed=0; broken=0
skips=()
run() {
    local out
    out=$("$@" 2>&1); local rc=$?
    echo "$out" | grep -E "FAIL|passed, [0-9]+ failed" || true
    local line
    line=$(echo "$out" | grep -E "^[^ ].*: [0-9]+ passed, [0-9]+ failed$" | tail -n 1)
    local nfail=""
    [ -n "$line" ] && nfail=$(echo "$line" | sed -E 's/.* ([0-9]+) failed/\1/')
    # no summary line, or a failing exit that the summary does not account for: broken
    if [ -z "$line" ] || { [ $rc -ne 0 ] && [ "$nfail" = "0" ]; }; then
        echo "$* exited $rc"; echo "$out" | tail -n 20; broken=$((broken + 1))
    fi
    # a failure's context: the test's last lines (what it printed before and around the check)
    if [ -n "$nfail" ] && [ "$nfail" != "0" ]; then echo "$out" | tail -n 30 | sed 's/^/  | /'; fi
    if [ -n "$line" ]; then
        passed=$((passed + $(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')))
        failed=$((failed + $(echo "$line" | sed -E 's/.* ([0-9]+) failed/\1/')))
    fi
    local skip
    while IFS= read -r skip; do skips+=("${skip#SKIP }"); done < <(echo "$out" | grep -E "^SKIP ")
}
for t in "$@"; do
    case "$t" in *.sh) run bash "$t" ;; *) run "$t" ;; esac
done
failed=$((failed + broken))
if [ ${#skips[@]} -gt 0 ]; then
    echo "skipped:"
    for s in "${skips[@]}"; do echo "  $s"; done
fi
echo "total: $passed passed, $failed failed, ${#skips[@]} skipped"
[ $failed -eq 0 ]
