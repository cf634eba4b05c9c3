#!/usr/bin/env bash
#
# test_docs.sh - what the documentation says is generated from, or checked
# against, the code, and each fact has one owner: the README's settings
# table is ipccache-config --markdown, every key of a real stats line is in
# the README's table, and the man page's settings, stats keys and limits are
# generated from those (tools/gen_man.py); each setting, key and limit is
# written once; links, named paths and the results/ paths of the README and
# docs/performance.md resolve; the README stays under its
# length; every version string agrees; every make target and every package
# tests/setup.sh installs are in docs/testing.md; every result folder entry
# is in results/README.md.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"
cd "$root" || exit 1

tap_setup docs
build=${IPCC_TEST_BUILD:-build}
TAP_SHOW="$tmp/diff"

# The Markdown table that starts with the header line $1.
readme_table() { awk -v head="$1" '$0 == head { on = 1 } on && !/^\|/ { exit } on' README.md; }

# --- settings: one source, shim/base/config.c --------------------------------
if [[ -x build/ipccache-config ]]; then
    build/ipccache-config --markdown >"$tmp/want"
    readme_table "| Variable | Default | Meaning |" >"$tmp/have"
    diff "$tmp/have" "$tmp/want" >"$tmp/diff"
    check "docs: README settings table is ipccache-config --markdown (regenerate it from that)" \
        test ! -s "$tmp/diff"
    : >"$tmp/diff"
    for name in $(cut -f1 <(build/ipccache-config --list)); do
        grep -q "^\.B \\\\%$name\$" tools/ipccache.7 || echo "$name" >>"$tmp/diff"
    done
    check "docs: the man page describes every setting" test ! -s "$tmp/diff"
    cut -f1 <(build/ipccache-config --list) | python3 tests/tools/check_docs.py once >"$tmp/diff" 2>&1
    check "docs: each setting has one table row, the README's" test ! -s "$tmp/diff"
    python3 tools/gen_man.py --check >"$tmp/diff" 2>&1
    check "docs: the man page's settings, stats keys and limits are generated (tools/gen_man.py)" \
        test ! -s "$tmp/diff"
else
    not_ok "docs: build/ipccache-config is built"
fi

# --- stats keys: one real line from the library -------------------------------
lib=$build/libipccache.so
if [[ -f $lib && -x $build/tests/probe ]]; then
    LD_LIBRARY_PATH=$build/tests LD_PRELOAD="${IPCC_TEST_PRELOAD_PREFIX:+$IPCC_TEST_PRELOAD_PREFIX:}$lib" \
        IPCCACHE_STATS_AT_EXIT=1 IPCCACHE_STATS_FILE="$tmp/stats" \
        "$build/tests/probe" openclose 3 >/dev/null 2>&1
    python3 -c '
import json, sys
line = json.loads(open(sys.argv[1]).read().splitlines()[-1])
keys = set(line) | {k for entry in line.get("top", []) for k in entry}
print("\n".join(sorted(keys)))' "$tmp/stats" >"$tmp/keys" 2>"$tmp/diff"
    check "docs: the library wrote a stats line" test -s "$tmp/keys"
    readme_table "| Key | Meaning |" >"$tmp/table"
    : >"$tmp/diff"
    while read -r key; do
        grep -q "\`$key\`" "$tmp/table" || echo "README: $key" >>"$tmp/diff"
        grep -qE "^\.B[R]* .*\b$key\b|\\\\fB$key\\\\fR" tools/ipccache.7 || echo "man page: $key" >>"$tmp/diff"
    done <"$tmp/keys"
    check "docs: every stats key is documented (README table, man page)" test ! -s "$tmp/diff"
    python3 -c 'import json, sys; print("\n".join(json.loads(open(sys.argv[1]).read().splitlines()[-1])))' \
        "$tmp/stats" | python3 tests/tools/check_docs.py once >"$tmp/diff" 2>&1
    check "docs: each stats key has one table row, the README's" test ! -s "$tmp/diff"
else
    not_ok "docs: stats keys: $lib or $build/tests/probe is not built"
fi

# --- make demo states its result -------------------------------------------------
if [[ $build != *sanitize* && -f $lib && -x $build/tests/probe ]]; then
    # Its own count (2,000 opens, well under a second), so that its last line is the README's quote.
    DEMO_SIMULATED=1 IPCCACHE_LIB=$lib BUILD=$build bash tools/demo.sh >"$tmp/demo" 2>&1
    quoted=$(grep -o '`demo: result: [^`]*`' README.md | tr -d '`')
    { echo "README: $quoted"; echo "demo:   $(tail -n 1 "$tmp/demo")"; } >"$tmp/diff"
    check "docs: make demo's last line is its result, exactly as the README quotes it, and it explains real_closes" \
        eval '[[ -n $quoted && $(tail -n 1 "$tmp/demo") == "$quoted" ]] && grep -q "real_closes is 0" "$tmp/demo"'
    # make demo as make test: a line for the build, no command lines (V=1 shows them).
    DEMO_SIMULATED=1 DEMO_ITERS=50 make --no-print-directory demo BUILD="$build" >"$tmp/diff" 2>&1
    check "docs: make demo says its build in one line, no commands, and ends with its result" \
        eval '[[ $(head -n 1 "$tmp/diff") == "demo: building the library, the stand-in driver and the probe (V=1 shows the commands)" ]] &&
              ! grep -qE "^(cc|gcc|make)( |\[|:)" "$tmp/diff" && tail -n 1 "$tmp/diff" | grep -q "^demo: result: 50 opens"'
else
    skip "docs: make demo's result" "make test runs it (plain build)"
fi

# --- the README's no-GPU example ------------------------------------------------
# Its sh block: no export (on a GPU host the stand-in would shadow the real
# libcuda in every later command), and its first command, run from the root
# (with the build of this run), prints what the README says.
awk '/^### See it work without a GPU/ { on = 1 } on && /^```sh/ { code = 1; next }
     code && /^```/ { exit } code' README.md >"$tmp/example"
check "docs: the no-GPU example sets its variables per command (env), never export" \
    eval '[[ -s $tmp/example ]] && ! grep -qE "(^|[;&|] *)export " "$tmp/example"'
if [[ $build == *sanitize* ]]; then
    skip "docs: the no-GPU example's first command" "make test runs it (plain build)"
elif [[ -f $lib && -x $build/tests/probe ]]; then
    first=$(awk '{ if (sub(/\\$/, "")) { buf = buf $0; next } print buf $0; exit }' "$tmp/example" |
        sed "s#\$PWD/build#$build#g")
    bash -c "$first" >"$tmp/diff" 2>&1
    check "docs: the no-GPU example's first command prints maps=1 and the stats line" \
        eval 'grep -qx "maps=1" "$tmp/diff" && grep -q "\"hits\":99," "$tmp/diff"'
else
    not_ok "docs: the no-GPU example: $lib or $build/tests/probe is not built"
fi

# --- one version --------------------------------------------------------------
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
{
    grep -H '^#define IPCC_VERSION ' shim/base/base.h
    grep -H '^readonly VERSION=' tools/ipccache-run
    grep -H '^VERSION = ' tools/ipccache-stats
    grep -H '^__version__ = ' python/ipccache/__init__.py
    grep -H '^\.TH ' tools/ipccache.7
} | grep -vF "$version" >"$tmp/diff"
check "docs: every version string is $version" test ! -s "$tmp/diff"
year=$(sed -n 's/^Copyright (c) \([0-9]*\).*/\1/p' LICENSE)
: >"$tmp/diff"
check "docs: the man page is dated $year or later" \
    eval '[[ $(sed -n "s/^\.TH [^ ]* [^ ]* \([0-9]*\).*/\1/p" tools/ipccache.7) -ge $year ]]'

# --- exit statuses as the tools' help states them ------------------------------
python3 tools/ipccache-stats notapid >/dev/null 2>"$tmp/diff"
rc=$?
python3 tools/ipccache-stats --help | tr -s " \n" " " | grep -q "2 usage error"
help_says=$?
check "docs: ipccache-stats exits 2 on a usage error (notapid), as its help says" \
    eval '[[ $help_says == 0 && $rc == 2 ]]'
check "docs: ipccache-run --help says --strict means exit status 78" \
    eval 'tools/ipccache-run --help | tr -s " \n" " " | grep -q "error: exit status 78"'

# --- the layout: links, paths, one owner, length ---------------------------------
for what in links paths results limits length comments layers; do
    python3 tests/tools/check_docs.py "$what" >"$tmp/diff" 2>&1
    check "docs: check_docs.py $what" test ! -s "$tmp/diff"
done

# A comment naming a file that is gone and a heading that is not there fails.
mkdir -p "$tmp/stale/tests/tools" "$tmp/stale/shim" "$tmp/stale/docs"
cp tests/tools/check_docs.py "$tmp/stale/tests/tools/"
printf '# Title\n\n## Files\n' >"$tmp/stale/README.md"
printf '/* gone.c moved (README "Files"; README "How it was") */\n' >"$tmp/stale/shim/a.c"
printf '/* ipcc_gone() and ipcc_gone_* went; ipcc_here and ipcc_he* stay */\nint ipcc_here(void);\n' \
    >"$tmp/stale/shim/b.c"
git -C "$tmp/stale" init -q && git -C "$tmp/stale" add -A &&
    python3 "$tmp/stale/tests/tools/check_docs.py" comments >"$tmp/diff" 2>&1
check "docs: a comment naming a file that is gone fails" \
    grep -qx 'shim/a.c:1: names gone.c, which is no file' "$tmp/diff"
check "docs: a comment citing a heading that is not there fails" \
    grep -qx 'shim/a.c:1: cites README "How it was", which is no heading' "$tmp/diff"
check "docs: a comment of shim/ naming a function or prefix the code lacks fails" \
    eval "grep -qx 'shim/b.c:1: names ipcc_gone, which the code does not' \"$tmp/diff\" &&
          grep -qx 'shim/b.c:1: names ipcc_gone_\*, which the code does not' \"$tmp/diff\" &&
          [[ \$(wc -l <\"$tmp/diff\") -eq 4 ]]"

# A results/ path the README or docs/performance.md names that is not there fails.
mkdir -p "$tmp/runs/tests/tools" "$tmp/runs/docs" "$tmp/runs/results/2026-01-01-gpu"
cp tests/tools/check_docs.py "$tmp/runs/tests/tools/"
: >"$tmp/runs/results/2026-01-01-gpu/summary.md"
printf '| a | 1 | `results/2026-01-01-gpu/summary.md` |\n| b | 2 | results/2026-01-02-gpu/summary.md |\n' \
    >"$tmp/runs/README.md"
printf 'From [the run](../results/2026-01-01-gpu/summary.md), not `results/<date>-<gpu>/`.\n' \
    >"$tmp/runs/docs/performance.md"
python3 "$tmp/runs/tests/tools/check_docs.py" results >"$tmp/diff" 2>&1
check "docs: a results/ path the README names that is not there fails" \
    eval "grep -qx 'README.md: results/2026-01-02-gpu/summary.md does not exist' \"$tmp/diff\" &&
          [[ \$(wc -l <\"$tmp/diff\") -eq 1 ]]"

# --- make targets, prerequisites -------------------------------------------------
# make help (the Makefile's header) is the one list of targets: each it names,
# and each `make X` a document names, is a rule of the Makefile.
is_rule() { grep -qE "^([^:#= ]+ )*$1( [^:#= ]+)*:([^=]|\$)" Makefile; }
{ make --no-print-directory help | awk 'substr($0, 6, 1) != " " { print $2 }'
  grep -ohE '`make [a-z][a-z0-9-]*' README.md docs/*.md examples/README.md | cut -c7-
} | sort -u | while read -r target; do
    is_rule "$target" || echo "no rule in the Makefile: make $target"
done >"$tmp/diff"
check "docs: every target make help and the documents name is a rule of the Makefile" \
    test ! -s "$tmp/diff"
grep -o 'missing+=([a-z0-9.-]*)' tests/setup.sh | sed 's/missing+=(\(.*\))/\1/' | sort -u |
    while read -r pkg; do
        grep -q "^| .*\`$pkg\`" docs/testing.md || echo "not in the prerequisites table: $pkg"
    done >"$tmp/diff"
check "docs: every package tests/setup.sh installs is in docs/testing.md's prerequisites" \
    test ! -s "$tmp/diff"
: >"$tmp/diff"
check "docs: without cuda.h, setup.sh and docs/testing.md name the way out (nvidia-cuda-runtime)" \
    eval 'grep -q nvidia-cuda-runtime tests/setup.sh && grep -q "pip install nvidia-cuda-runtime" docs/testing.md'

# --- results/ -------------------------------------------------------------------
: >"$tmp/diff"
for entry in results/*/*; do
    name=${entry#results/}
    [[ -d $entry ]] && name=$name/
    grep -qF "$name" results/README.md 2>/dev/null || echo "not in results/README.md: $name" >>"$tmp/diff"
done
check "docs: results/README.md describes every run's files" test ! -s "$tmp/diff"
: >"$tmp/diff"
check "docs: the README links results/README.md" grep -qF "results/README.md" README.md

tap_summary docs
