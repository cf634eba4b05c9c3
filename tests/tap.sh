# tap.sh - sourced by the shell suites: one "ok - NAME" / "not ok - NAME" /
# "ok - NAME # SKIP WHY" line per case, then tap_summary WORD prints the
# "WORD: N passed, M failed, K skipped" line tests/run.sh adds in and
# returns non-zero on any failure.

tap_passed=0 tap_failed=0 tap_skipped=0

ok() { echo "ok - $1"; tap_passed=$((tap_passed + 1)); }
not_ok() { echo "not ok - $1"; tap_failed=$((tap_failed + 1)); }
skip() { echo "ok - $1 # SKIP $2"; tap_skipped=$((tap_skipped + 1)); }

# check NAME COMMAND...: one case from COMMAND's exit status; on failure the
# files named in $TAP_SHOW (if any) are shown as comments.
check() {
    local name=$1
    shift
    if "$@"; then
        ok "$name"
    else
        not_ok "$name"
        [[ -z ${TAP_SHOW:-} ]] || sed 's/^/#   /' $TAP_SHOW 2>/dev/null | head -n 40
    fi
}

# expect NAME FILE PATTERN: one case, FILE has a line matching the extended
# regex PATTERN (on failure FILE's first lines are shown as comments).
expect() {
    if grep -Eq -- "$3" "$2"; then ok "$1"; else not_ok "$1 (no line /$3/ in $2)"; sed 's/^/#   /' "$2" | head -n 30; fi
}

# expect_not NAME FILE PATTERN: one case, no line of FILE matches PATTERN.
expect_not() {
    if grep -Eq -- "$3" "$2"; then not_ok "$1 (a line /$3/ in $2)"; sed 's/^/#   /' "$2" | head -n 30; else ok "$1"; fi
}

# expect_status NAME STATUS WANTED: one case, a command's exit status.
expect_status() {
    if [[ $2 -eq $3 ]]; then ok "$1"; else not_ok "$1 (status $2, wanted $3)"; fi
}

tap_summary() {
    echo "$1: $tap_passed passed, $tap_failed failed, $tap_skipped skipped"
    [[ $tap_failed -eq 0 ]]
}

# A clean start: none of the caller's preload or IPCCACHE_* settings, and a
# private folder $tmp, removed at exit after tap_cleanup (a suite that
# starts processes redefines it).
tap_setup() {
    unset LD_PRELOAD
    local name
    while read -r name; do unset "$name"; done < <(compgen -e | grep '^IPCCACHE_')
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/ipccache-$1.XXXXXX") || exit 1
    trap 'tap_cleanup; rm -rf "$tmp"' EXIT
}
tap_cleanup() { :; }
