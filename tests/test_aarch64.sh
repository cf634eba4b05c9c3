#!/usr/bin/env bash
#
# test_aarch64.sh BUILD - the aarch64 build (cross-compiled into BUILD) run
# under qemu-user: the dlsym trampoline keeps RTLD_NEXT right, lookups get
# the hooks, the cache caches, errors are the driver's, fork and threads
# work, a process without IPC sees nothing, a second interposer works in
# either order, and exit survives a signal handler and an unloaded driver.
# Ends with the line "aarch64: N passed, M failed".
set -u

build=${1:?usage: test_aarch64.sh BUILD}
qemu=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
lib=$build/libipccache.so
passed=0 failed=0
out=$(mktemp) err=$(mktemp)
# The run's own per-user folder, as tests/run.sh gives the other suites: the
# release ledger in the shared one may list the stand-in's handle bytes (pid,
# serial, size) as let go by an earlier process with the pid the probe's
# made-up exporter has now, and a mapping of a let-go handle is not kept.
private=$(mktemp -d)
trap 'rm -rf "$out" "$err" "$private"' EXIT

rc=0
# guest [--plain | --preload LIST] [VAR=VALUE...] PROGRAM ARGS...: run under
# qemu with the stand-in driver, and the library preloaded (--plain: nothing;
# --preload: LIST instead).
guest() {
    local env=(-E "LD_LIBRARY_PATH=$build/tests" -E "XDG_RUNTIME_DIR=$private")
    case $1 in
        --plain) shift ;;
        --preload) env+=(-E "LD_PRELOAD=$2"); shift 2 ;;
        *) env+=(-E "LD_PRELOAD=$lib") ;;
    esac
    while [[ $1 == *=* ]]; do env+=(-E "$1"); shift; done
    timeout 60 "${qemu[@]}" "${env[@]}" "$@" >"$out" 2>"$err"
    rc=$?
}

check() {
    local name=$1; shift
    if "$@"; then
        echo "ok - $name"; passed=$((passed + 1))
    else
        echo "not ok - $name"; failed=$((failed + 1))
        sed 's/^/#   /' "$out" "$err" | head -n 20
    fi
}

has() { grep -qx -- "$1" "$out"; }
quiet() { [ ! -s "$err" ]; }

guest "$build/tests/rtld_next_check"
check "RTLD_NEXT from a library finds the next library" has next_from_library=1
check "RTLD_NEXT from the program" has next_from_program=1
check "RTLD_DEFAULT and hooked names" eval 'has default_lookup=1 && has hooked_name=1 && [ $rc -eq 0 ]'

guest "$build/tests/probe" noipc
check "a CUDA process without IPC: quiet, no handler" eval 'quiet && has sigusr1=default'

guest "$build/tests/probe" cudart_sequence
check "cudart's lookup sequence gets the hooks" eval 'has open_is_hooked=1 && has resolver_is_hooked=1 && has init_is_hooked=0'

guest IPCCACHE_STATS_AT_EXIT=1 "$build/tests/probe" openclose 100
check "100 opens, one real map" eval 'has maps=1 && has open_calls=1'
check "the stats line" grep -q '"opens":100,"hits":99,"misses":1' "$err"

# The codes, less what differs by design (pid; how many real maps a reopen took).
codes() { grep -vE '^(pid|reopen_maps_delta)=' "$1" | sort; }
guest --plain "$build/tests/probe" errors
codes "$out" >"$out.plain"
guest "$build/tests/probe" errors
check "error codes as the driver's alone" eval 'diff "$out.plain" <(codes "$out") && has double_close=1'
rm -f "$out.plain"

guest "$build/tests/probe" fork
check "fork: the child maps afresh and exits cleanly" eval \
    'has child_open_calls_delta=1 && has child_exit=0 && has spin_errors=0 && [ $rc -eq 0 ]'

guest "$build/tests/probe" threads 8
check "8 threads share one mapping per handle" eval 'has errors=0 && has ptr_mismatches=0 && [ $rc -eq 0 ]'

# A second interposer: it sees only the one miss when after ipccache, every
# call when before it, and never comes back into itself.
for kind in next handle getproc resolver; do
    other=$build/tests/libinterposer_$kind.so
    path=linked; [ $kind = resolver ] && path=resolver
    guest --preload "$lib:$other" "$build/tests/probe" interposed 10 $path
    check "interposer ($kind) after ipccache" eval 'has interposer_reentries=0 &&
        has interposer_opens=1 && has open_calls=1 && [ $rc -eq 0 ]'
    guest --preload "$other:$lib" "$build/tests/probe" interposed 10 $path
    check "interposer ($kind) before ipccache" eval 'has interposer_reentries=0 &&
        has interposer_opens=10 && has open_calls=1 && [ $rc -eq 0 ]'
done

# Under emulation start-up is slow enough for the timer to fire inside it
# too, where atexit() once held the lock exit() needs (about 1 run in 15).
hung=0
for i in $(seq 30); do
    guest "$build/tests/probe" exitsignal
    [ $rc -eq 0 ] || hung=$((hung + 1))
done
check "exit() from a signal handler, 30 runs" eval '[ $hung -eq 0 ]'

guest "$build/tests/probe" dlclose
check "the driver dlclosed before exit" eval 'has dlclose_rc=0 && quiet && [ $rc -eq 0 ]'

echo "aarch64: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
