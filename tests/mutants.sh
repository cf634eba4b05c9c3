#!/usr/bin/env bash
#
# mutants.sh [NAME|NUMBER ...] - make mutants: applies each mutation of
# tests/mutants.txt, alone, to a copy of the tree and checks that the test
# suite (make run-tests, without its fuzz batch) or a fuzz batch catches it.
#
# The tree (with its build folder, so each mutant rebuilds only what its
# change touches) is copied once and checked unmutated first: a mutant is
# caught by the suite when a test fails that passed in that baseline (so a
# test that already fails, e.g. one that other processes on the machine
# disturb, does not count; the new failures are shown), and by the fuzz batch when a seed fails (the baseline's
# batch must pass, else the run stops).
# Each mutant then gets a fresh copy of the baseline. Verdicts:
#   caught (suite, fuzz)   what failed
#   NOT caught             both passed: a test is missing
#   does not apply         its fragment is not in the file exactly once
#   does not build         the mutated tree does not compile
# Ends with "mutants: N caught, M not caught, K do not apply" and exits
# non-zero unless every mutant was caught.
#
# MUTANT_FUZZ_SEEDS: seeds in each fuzz batch (default 200; 0: suite only).
# IPCC_FUZZ_NO_ALIASES is passed on (see tests/fuzz.c).

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
list=$root/tests/mutants.txt
seeds=${MUTANT_FUZZ_SEEDS:-200}
work=$(mktemp -d "${TMPDIR:-/tmp}/ipccache-mutants.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT

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

# Failing tests in a suite log, one per line, sorted: Criterion's "[FAIL]
# area::name", the tools' "not ok - name", run.sh's complaints.
failures() {
    sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -E '^\[FAIL\]|^not ok|^run\.sh:' |
        sed -E 's/^(\[FAIL\] [^:]+::[^:]+):.*/\1/' | sort -u
}

# Tests passed, from the suite's last line (none: -1).
passed_count() {
    sed -n 's/^tests: \([0-9]*\) passed.*/\1/p' "$1" | tail -n 1 | grep . || echo -1
}

# Tests that fail in suite log $1 and did not in the baseline.
new_in() {
    comm -13 <(failures "$work/base.suite") <(failures "$1")
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
        ! (cd "$tree" && FUZZ_STOP=1 FUZZ_FLAKY_OK=1 bash tests/fuzz.sh build --seeds "$seeds") \
            >"$work/$name.fuzz" 2>&1; then
        what+=(fuzz)
    fi
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
failed=$(check "$work/base" base)
base_passed=$(passed_count "$work/base.suite")
if [[ -n $failed || $base_passed -lt 0 ]]; then
    echo "mutants: the unmutated tree's fuzz batch fails or its suite does not finish; no verdict is possible"
    tail -n 5 "$work/base.fuzz" "$work/base.suite" | sed 's/^/    /'
    exit 1
fi
if [[ -n $(failures "$work/base.suite") ]]; then
    echo "mutants: the baseline already fails these; they do not count against a mutant:"
    failures "$work/base.suite" | sed 's/^/    /'
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
    if ! (cd "$tree" && make --no-print-directory all) >"$work/m$num.build" 2>&1; then
        printf 'mutant %2d %-28s does not build\n' "$num" "$name"
        broken=$((broken + 1))
        continue
    fi
    failed=$(check "$tree" "m$num")
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
echo "mutants: $caught caught, $missed not caught, $broken do not apply"
[[ $missed -eq 0 && $broken -eq 0 ]]
