#!/usr/bin/env bash
#
# mutants.sh [NAME|NUMBER ...] - make mutants: applies each mutation of
# tests/fuzz/mutants.txt, alone, to a copy of the tree and checks that the tests
# catch it.
#
# The tree (with its build folder, so each mutant rebuilds only what its
# change touches) is copied once and checked unmutated first. A mutant is
# caught when a test that passed in that baseline fails with the mutant, in
# two runs (so a test that already fails, or one that a loaded machine
# disturbs now and then, does not count; the new failures are shown). Cheapest
# first, so the run stays affordable on a small shared machine:
#   1. the Criterion programs (test_unit, test_e2e, test_process, test_ghost:
#      seconds); most mutants stop here;
#   2. only if they all pass: the whole suite (make run-tests, without its
#      fuzz batch), then a fuzz batch (caught when a seed fails twice). The
#      baseline's suite and batch run once, the first time a mutant needs
#      them; the baseline's batch must pass, else the run stops.
# Each mutant gets a fresh copy of the baseline. Verdicts:
#   caught (criterion, suite, fuzz)   what failed
#   NOT caught             everything passed: a test is missing
#   does not apply         its fragment is not in the file exactly once
#   does not build         the mutated tree does not compile
# Ends with "mutants: N caught, M not caught, K do not apply" and exits
# non-zero unless every mutant was caught.
#
# MUTANT_FULL=1: skip stage 1 (every mutant gets the suite and the batch).
# MUTANT_HANG_S: how long a Criterion program may run (default 300 s; they
# take seconds).
# MUTANT_FUZZ_SEEDS: seeds in each fuzz batch (default 200; 0: suite only).
# IPCC_FUZZ_NO_ALIASES is passed on (see tests/fuzz/fuzz.c).

set -u
shopt -s extglob
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
list=$root/tests/fuzz/mutants.txt
seeds=${MUTANT_FUZZ_SEEDS:-200}
full=${MUTANT_FULL:-0}
hang_s=${MUTANT_HANG_S:-300}
work=$(mktemp -d "${TMPDIR:-/tmp}/ipccache-mutants.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
chmod 711 "$work" # a tool test runs a process as another user on the copy's library
start=$SECONDS

# mutant.py list FILE: "NUMBER<TAB>NAME<TAB>FILE<TAB>DESCRIPTION" per mutant;
# mutant.py apply FILE NUMBER TREE: applies one; exit 3 (and the match count
# on stdout) when its fragment is not there exactly once.
cat >"$work/mutant.py" <<'PY'
import sys

def parse(path):
    mutants, cur = [], None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("## "):
            name, _, desc = line[3:].partition(": ")
            cur = {"name": name.strip(), "desc": desc.strip()}
            mutants.append(cur)
        elif cur is not None and line.split(":", 1)[0] in ("file", "find", "replace"):
            key, _, value = line.partition(": ")
            cur[key] = value.replace("\\n", "\n")
    return mutants

mutants = parse(sys.argv[2])
if sys.argv[1] == "list":
    for i, m in enumerate(mutants, 1):
        print(f"{i}\t{m['name']}\t{m.get('file', '?')}\t{m['desc']}")
else:
    m = mutants[int(sys.argv[3]) - 1]
    path = f"{sys.argv[4]}/{m.get('file', '')}"
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        print("no such file")
        sys.exit(3)
    n = text.count(m.get("find", "\0"))
    if n != 1 or "replace" not in m:
        print(f"fragment found {n} times")
        sys.exit(3)
    open(path, "w", encoding="utf-8").write(text.replace(m["find"], m["replace"]))
PY

mapfile -t all < <(python3 "$work/mutant.py" list "$list")
if [[ ${#all[@]} -eq 0 ]]; then
    echo "mutants: no mutants in $list"
    exit 2
fi
want=" $* "

# Failing tests in a log, one per line, sorted: Criterion's "[FAIL]
# area::name", the tools' "not ok - name", run.sh's and our complaints.
failures() {
    sed -e 's/\x1b\[[0-9;]*m//g' -e "s#$work/[^/]*/#TREE/#g" "$1" | grep -E '^\[FAIL\]|^not ok|^run\.sh:|^mutants\.sh:' |
        sed -E 's/^(\[FAIL\] [^:]+::[^:]+):.*/\1/' | sort -u
}

# Tests passed, from the suite's last line (none: -1).
passed_count() {
    sed -n 's/^tests: \([0-9]*\) passed.*/\1/p' "$1" | tail -n 1 | grep . || echo -1
}

# Tests that fail in log $1 and did not in the baseline's log of that
# stage ($2: suite or criterion).
new_in() {
    comm -13 <(failures "$work/base.${2:-suite}") <(failures "$1")
}

# reap TREE: ends what a test left running in the copy TREE. A forked child
# that fails an assertion becomes a Criterion worker of its own, in a session
# of its own, and waits forever for a runner that is gone.
reap() {
    local d
    for d in /proc/[0-9]*; do
        [[ $(readlink "$d/cwd" 2>/dev/null) == "$1"@(| *|/*) ]] && kill -KILL "${d#/proc/}" 2>/dev/null
    done
}

# criterion TREE LOG: the Criterion programs, in the environment run.sh gives
# them (a private TMPDIR and XDG_RUNTIME_DIR); a program that ends without its
# summary line (crashed, or still running after MUTANT_HANG_S seconds: a
# mutant can make a test wait forever for something that never comes) is
# one failure.
criterion() {
    local tree=$1 log=$2 private bin pid
    private=$(mktemp -d "$work/env.XXXXXX") && chmod 711 "$private" && mkdir -m 700 "$private/run"
    : >"$log"
    for bin in test_unit test_e2e test_process test_ghost; do
        # timeout runs the program in a process group of its own: whatever a
        # mutated test left running in it goes too.
        (cd "$tree" && IPCC_TEST_BUILD=build TMPDIR=$private XDG_RUNTIME_DIR=$private/run \
            exec timeout -k 10 "$hang_s" "build/tests/$bin" --jobs 2) >"$log.one" 2>&1 &
        pid=$!
        wait "$pid"
        kill -KILL -- "-$pid" 2>/dev/null
        reap "$tree"
        cat "$log.one" >>"$log"
        grep -q 'Synthesis: Tested:' "$log.one" ||
            echo "mutants.sh: $bin ended without its summary" >>"$log"
    done
    rm -rf "$private" "$log.one"
}

# quick TREE NAME: "criterion" when a Criterion test that passed in the
# baseline fails in two runs (the new failures in $work/NAME.new).
quick() {
    local tree=$1 name=$2
    criterion "$tree" "$work/$name.crit1"
    [[ -n $(new_in "$work/$name.crit1" criterion) ]] || return 0
    criterion "$tree" "$work/$name.crit2"
    comm -12 <(new_in "$work/$name.crit1" criterion) <(new_in "$work/$name.crit2" criterion) \
        >"$work/$name.new"
    [[ -s $work/$name.new ]] && echo criterion
}

# The baseline's suite and fuzz batch, once, when a mutant first needs them;
# exits when the batch fails or the suite does not finish.
base_full() {
    [[ -f $work/base.suite ]] && return
    echo "mutants: baseline suite and fuzz batch (the tree as it is)"
    local failed
    failed=$(check "$work/base" base)
    if [[ -n $failed || $(passed_count "$work/base.suite") -lt 0 ]]; then
        echo "mutants: the unmutated tree's fuzz batch fails or its suite does not finish; no verdict is possible"
        tail -n 5 "$work/base.fuzz" "$work/base.suite" | sed 's/^/    /'
        exit 1
    fi
    if [[ -n $(failures "$work/base.suite") ]]; then
        echo "mutants: the baseline suite already fails these; they do not count against a mutant:"
        failures "$work/base.suite" | sed 's/^/    /'
    fi
}

# check TREE NAME: runs the suite (log in $work/NAME.suite) and a fuzz batch
# ($work/NAME.fuzz); prints what caught it: "suite" when a test fails that
# passed in the baseline, in two runs of the suite (tests that depend on
# timing fail now and then on a loaded machine), "fuzz" when a seed fails
# twice.
check() {
    local tree=$1 name=$2 what=()
    suite() { (cd "$tree" && IPCC_FUZZ_SEEDS=0 make --no-print-directory run-tests) >"$1" 2>&1; }
    suite "$work/$name.suite"
    if [[ $name != base && ( -n $(new_in "$work/$name.suite") || $(passed_count "$work/$name.suite") -lt 0 ) ]]; then
        cp "$work/$name.suite" "$work/$name.suite1"
        suite "$work/$name.suite2"
        comm -12 <(new_in "$work/$name.suite1") <(new_in "$work/$name.suite2") >"$work/$name.new"
        [[ -s $work/$name.new || $(passed_count "$work/$name.suite2") -lt 0 ]] && what+=(suite)
    fi
    if [[ $seeds != 0 ]] &&
        ! (cd "$tree" && FUZZ_STOP=1 FUZZ_FLAKY_OK=1 bash tests/fuzz/fuzz.sh build --seeds "$seeds") \
            >"$work/$name.fuzz" 2>&1; then
        what+=(fuzz)
    fi
    reap "$tree"
    local IFS=,
    echo "${what[*]}"
}

# What a caught mutant broke that the baseline did not (first few).
new_failures() {
    head -n 3 "$work/$1.new" 2>/dev/null | sed 's/^/      /'
    grep -m 1 -E '^fuzz: seed .*FAILED;' "$work/$1.fuzz" 2>/dev/null | sed 's/^/      /'
}

echo "mutants: baseline (the tree as it is)"
tar -C "$root" --exclude=./.git -cf - . | (mkdir -p "$work/base" && tar -C "$work/base" -xf -)
if ! (cd "$work/base" && make --no-print-directory test-programs) >"$work/base.build" 2>&1; then
    echo "mutants: the unmutated tree does not build"
    tail -n 5 "$work/base.build" | sed 's/^/    /'
    exit 1
fi
if [[ $full != 1 ]]; then
    criterion "$work/base" "$work/base.criterion"
    if [[ -n $(failures "$work/base.criterion") ]]; then
        echo "mutants: the baseline's Criterion programs already fail these; they do not count against a mutant:"
        failures "$work/base.criterion" | sed 's/^/    /'
    fi
fi

caught=0 missed=0 broken=0
for row in "${all[@]}"; do
    IFS=$'\t' read -r num name file desc <<<"$row"
    [[ $# -eq 0 || $want == *" $num "* || $want == *" $name "* ]] || continue
    tree=$work/m$num
    rm -rf "$tree"
    cp -a "$work/base" "$tree"
    if ! why=$(python3 "$work/mutant.py" apply "$list" "$num" "$tree"); then
        printf 'mutant %2d %-28s does not apply: %s (%s)\n' "$num" "$name" "$file" "$why"
        broken=$((broken + 1))
        continue
    fi
    if ! (cd "$tree" && make --no-print-directory test-programs) >"$work/m$num.build" 2>&1; then
        printf 'mutant %2d %-28s does not build\n' "$num" "$name"
        broken=$((broken + 1))
        continue
    fi
    failed=
    [[ $full == 1 ]] || failed=$(quick "$tree" "m$num")
    if [[ -z $failed ]]; then
        base_full
        failed=$(check "$tree" "m$num")
    fi
    if [[ -n $failed ]]; then
        printf 'mutant %2d %-28s caught (%s)\n' "$num" "$name" "$failed"
        new_failures "m$num"
        caught=$((caught + 1))
    else
        printf 'mutant %2d %-28s NOT caught: %s\n' "$num" "$name" "$desc"
        missed=$((missed + 1))
    fi
    rm -rf "$tree"
done
echo "mutants: $caught caught, $missed not caught, $broken do not apply ($((SECONDS - start)) s)"
[[ $missed -eq 0 && $broken -eq 0 ]]
