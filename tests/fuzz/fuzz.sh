#!/usr/bin/env bash
#
# fuzz.sh BUILD [--seeds N] [--first S] [--seed S [--keep LIST]] [--nofile N]
#
# The differential fuzzer: runs BUILD/tests/fuzz (tests/fuzz/fuzz.c) for each seed
# once without and once with LD_PRELOAD=BUILD/libipccache.so, against the
# stand-in driver. The two outputs (every return code, pointer-equality facts,
# the driver's mappings left after exit) must be identical and nothing may be
# printed on stderr. A failing seed is re-run; if it fails again, ops are
# removed greedily while it still fails, and the shortest failing sequence is
# printed with the command that reproduces it.
#
#   --seeds N --first S   seeds S .. S+N-1 (default 200 from 1)
#   --seed S --keep LIST  one seed, only the listed ops (as printed on failure)
#   --nofile N            both sides at a soft limit of N open files (the cache
#                         keeps at most N/8 fds: past that VMM imports go uncached)
#
# Ends with "fuzz: N passed, M failed (seeds A..B)"; exits 1 if any failed.
# FUZZ_MIN_TRIES bounds the runs spent minimising one seed (default 300);
# FUZZ_MAX_MINIMIZE how many failing seeds are minimised (default all).
# FUZZ_STOP=1 stops at the first failing seed; FUZZ_FLAKY_OK=1 does not
# count a seed that passes on its rerun (both for make mutants, which must
# not blame a mutant for a race of today's code).
# IPCC_FUZZ_NO_ALIASES=1 generates no aliased handles (see tests/fuzz/fuzz.c).

set -u

usage() { echo "usage: tests/fuzz/fuzz.sh BUILD [--seeds N] [--first S] [--seed S [--keep LIST]] [--nofile N]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
build=$1; shift
seeds=200 first=1 keep=all nofile=
while [[ $# -gt 0 ]]; do
    case $1 in
        --seeds) seeds=${2:?}; shift 2 ;;
        --first) first=${2:?}; shift 2 ;;
        --seed) first=${2:?}; seeds=1; shift 2 ;;
        --keep) keep=${2:?}; shift 2 ;;
        --nofile) nofile=${2:?}; shift 2 ;;
        *) usage ;;
    esac
done
[[ $seeds =~ ^[0-9]+$ && $first =~ ^[0-9]+$ && $nofile =~ ^[0-9]*$ ]] || usage
[[ -z $nofile ]] || ulimit -Sn "$nofile" || exit 2

prog=$build/tests/fuzz lib=$build/libipccache.so
if [[ ! -x $prog || ! -f $lib ]]; then
    echo "fuzz: $prog or $lib is missing (not built?)"
    echo "fuzz: 0 passed, 1 failed"
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ipccache-fuzz.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

# The seed chooses every setting; none may leak in from the caller.
for v in $(compgen -e | grep -E '^(IPCCACHE|FAKECUDA)_'); do unset "$v"; done
prefix=${IPCC_TEST_PRELOAD_PREFIX:-}

# run_side with|without SEED KEEP: stdout and exit status to $tmp/SIDE.out,
# stderr to $tmp/SIDE.err. The run's own per-user folder: its release ledger
# is not shared with other programs of the user.
run_side() {
    local side=$1 preload=$prefix
    [[ $side == with ]] && preload="${prefix:+$prefix:}$lib"
    LD_LIBRARY_PATH=$build/tests LD_PRELOAD=$preload \
        XDG_RUNTIME_DIR=$tmp IPCCACHE_STATS_FILE=$tmp/stats IPCCACHE_STATS_DIR=$tmp \
        IPCCACHE_RELEASE_WAIT_MS=15000 \
        timeout "${FUZZ_TIMEOUT:-20}" "$prog" "$2" "$3" >"$tmp/$side.out" 2>"$tmp/$side.err"
    echo "exit=$?" >>"$tmp/$side.out"
}

# Succeeds (status 0) when SEED with KEEP shows a difference.
differs() {
    run_side without "$1" "$2"
    run_side with "$1" "$2"
    ! cmp -s "$tmp/without.out" "$tmp/with.out" || [[ -s $tmp/without.err || -s $tmp/with.err ]]
}

show() {
    diff -U 1000 --label without --label with "$tmp/without.out" "$tmp/with.out" | sed 's/^/    /'
    local side
    for side in without with; do
        [[ -s $tmp/$side.err ]] && { echo "    stderr $side:"; sed 's/^/      /' "$tmp/$side.err"; }
    done
}

# Greedy removal: drop chunks of ops, halving the chunk, while it still fails.
minimize() {
    local seed=$1 total tries=0 max=${FUZZ_MIN_TRIES:-300}
    total=$("$prog" "$seed" count | sed -n 's/^ops=//p')
    local -a ops cand
    [[ $keep == all ]] && mapfile -t ops < <(seq 0 $((total - 1))) || IFS=, read -ra ops <<<"$keep"
    local chunk=$(((${#ops[@]} + 1) / 2)) i list
    while ((chunk >= 1 && tries < max)); do
        i=0
        while ((i < ${#ops[@]} && tries < max)); do
            cand=("${ops[@]:0:i}" "${ops[@]:i+chunk}")
            list=$(IFS=,; echo "${cand[*]}")
            tries=$((tries + 1))
            if differs "$seed" "${list:-none}"; then
                ops=("${cand[@]}")
            else
                i=$((i + chunk))
            fi
        done
        chunk=$((chunk / 2))
    done
    list=$(IFS=,; echo "${ops[*]}")
    differs "$seed" "${list:-none}" || true
    echo "fuzz: seed $seed FAILED; shortest failing sequence: ${#ops[@]} op(s)" \
         "(tests/fuzz/fuzz.sh $build --seed $seed --keep ${list:-none}${nofile:+ --nofile $nofile})"
    show
}

passed=0 failed=0
for ((seed = first; seed < first + seeds; seed++)); do
    if ! differs "$seed" "$keep"; then
        passed=$((passed + 1))
        continue
    fi
    failed=$((failed + 1))
    cp "$tmp/without.out" "$tmp/first.without"; cp "$tmp/with.out" "$tmp/first.with"
    if [[ -n ${FUZZ_MAX_MINIMIZE:-} ]] && ((failed > FUZZ_MAX_MINIMIZE)); then
        echo "fuzz: seed $seed FAILED (not minimised: tests/fuzz/fuzz.sh $build --seed $seed${nofile:+ --nofile $nofile})"
    elif differs "$seed" "$keep"; then
        minimize "$seed"
    else
        echo "fuzz: seed $seed FAILED once and passed on a rerun (depends on thread timing):"
        [[ ${FUZZ_FLAKY_OK:-0} == 1 ]] && { failed=$((failed - 1)); passed=$((passed + 1)); }
        diff -u --label without --label with "$tmp/first.without" "$tmp/first.with" | sed 's/^/    /'
    fi
    [[ ${FUZZ_STOP:-0} == 1 && $failed -gt 0 ]] && break
done
echo "fuzz: $passed passed, $failed failed (seeds $first..$((first + seeds - 1))${nofile:+, soft limit $nofile})"
[[ $failed -eq 0 ]]
