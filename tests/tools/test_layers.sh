#!/usr/bin/env bash
#
# test_layers.sh - every call and include between the library's files goes
# down the folders' order in shim/layers.txt: tests/tools/check_layers.py
# reads the built objects' symbols (nm), the sources' includes and each header
# compiled alone, and fails on a circle (of folders, or of files through their
# private headers), an upward or sideways call or include,
# an include of another folder's private header, a circle through headers,
# an interface naming what only its own folder uses
# (docs/design.md says which layer registers what with which).
# Also checks that the check itself sees each of those planted in small trees.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"
tap_setup layers
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
cc=${CC:-cc}
TAP_SHOW="$tmp/out"
check_layers() { python3 "$root/tests/tools/check_layers.py" "$@" >"$tmp/out" 2>&1; }
ordered() { # ordered TREE [ARG...]: the check of TREE's objects against TREE's layers.txt
    check_layers --order "$1/layers.txt" --src "$1/src" --cc "$cc" --cflags=-std=gnu11 "${@:2}" "$1/obj"
}

if [[ -d $build/shim ]]; then
    check_layers --order "$root/shim/layers.txt" --src "$root/shim" --cc "$cc" \
        --cflags="-std=gnu11 -I${CUDA_HOME:-/usr/local/cuda}/include" --tests "$root/tests/unit" \
        "$build/shim"
    check "layers: every call and include goes down shim/layers.txt" test $? -eq 0
    cat "$tmp/out"
else
    not_ok "layers: $build/shim is built"
fi

# The fork handlers are registered in one file; every reset runs from its list.
atfork=$(cd "$root" && grep -rl 'pthread_atfork' shim --include='*.c' --include='*.h')
check "layers: only shim/life/lifecycle.c registers fork handlers (found: $atfork)" \
    test "$atfork" = shim/life/lifecycle.c

# Two files that call each other, then the same two calling one way.
mkdir -p "$tmp/circle/low" "$tmp/oneway"
printf 'void high(void);\nvoid low(void) { high(); }\n' >"$tmp/low.c"
printf 'void low(void);\nvoid high(void) { low(); }\n' >"$tmp/high.c"
printf 'void low(void) { }\n' >"$tmp/low_alone.c"
"$cc" -c -o "$tmp/circle/low/low.o" "$tmp/low.c" &&
    "$cc" -c -o "$tmp/circle/high.o" "$tmp/high.c" &&
    "$cc" -c -o "$tmp/oneway/low.o" "$tmp/low_alone.c" &&
    cp "$tmp/circle/high.o" "$tmp/oneway/high.o"
check "layers: the planted objects build" test $? -eq 0
check_layers "$tmp/circle"
check "layers: a circle of two files fails the check" test $? -eq 1
check "layers: the failure names both files and the symbols" \
    grep -qx '  low/low -> high: high' "$tmp/out"
check_layers "$tmp/oneway"
check "layers: the same files calling one way pass" test $? -eq 0

# plant TREE ORDER: a tree of folders high/, mid/, low/ (layers.txt: ORDER, one
# line each, a "/" for peers on one line), each with <folder>.h; then files
# are added with put and built with build_tree.
plant() {
    rm -rf "$1"
    mkdir -p "$1/src/high" "$1/src/mid" "$1/src/low" "$1/obj"
    tr '/' ' ' <<<"$2" | tr ',' '\n' >"$1/layers.txt"
    for f in high mid low; do
        printf 'void %s(void);\n' "$f" >"$1/src/$f/$f.h"
        printf '#include "%s.h"\nvoid %s(void) { }\n' "$f" "$f" >"$1/src/$f/$f.c"
    done
}
put() { printf '%b' "$3" >"$1/src/$2"; }
build_tree() {
    local c o
    for c in "$1"/src/*/*.c; do
        o=$1/obj/${c#"$1"/src/}
        mkdir -p "$(dirname "$o")"
        "$cc" -std=gnu11 -I"$1/src" -I"$1/src/high" -I"$1/src/mid" -I"$1/src/low" \
            -c -o "${o%.c}.o" "$c" || return 1
    done
}
t=$tmp/tree
# finds LINE: the planted tree built and checked, its check prints LINE.
finds() { build_tree "$t" && ordered "$t"; grep -qxF "$1" "$tmp/out"; }

plant "$t" high,mid,low
put "$t" high/high.c '#include "mid.h"\nvoid high(void) { mid(); }\n'
put "$t" mid/mid.c '#include "low.h"\nvoid mid(void) { low(); }\n'
build_tree "$t" && ordered "$t"
check "layers: calls and includes down the declared order pass" test $? -eq 0

plant "$t" high,mid,low
put "$t" low/low.c '#include "high.h"\nvoid low(void) { high(); }\n'
build_tree "$t" && ordered "$t"
check "layers: a call up the declared order fails (no circle needed)" test $? -eq 1
check "layers: the failure names the files and the symbol" \
    grep -qx 'check_layers: upward call low/low -> high/high: high' "$tmp/out"
check "layers: an include up the declared order fails" \
    grep -qx 'check_layers: upward include low/low -> high/high.h: high.h' "$tmp/out"

plant "$t" high/mid,low
put "$t" high/high.c '#include "mid.h"\nvoid high(void) { mid(); }\n'
check "layers: a call between peers fails" \
    finds 'check_layers: call between peers high/high -> mid/mid: mid'

plant "$t" high,mid,low
put "$t" low/low_impl.h 'void low_inner(void);\n'
put "$t" low/low.c '#include "low_impl.h"\nvoid low(void) { }\nvoid low_inner(void) { }\n'
put "$t" high/high.c '#include "low_impl.h"\nvoid high(void) { low_inner(); }\n'
check "layers: an include of another folder's private header fails" \
    finds "check_layers: include of another folder's private header high/high -> low/low_impl.h"

# A module's header (as base/log.h) is the folder's own: others reach it
# through the folder's umbrella header only.
plant "$t" high,mid,low
put "$t" low/log.h 'void low_log(void);\n'
put "$t" low/low.h '#include "log.h"\nvoid low(void);\n'
put "$t" low/log.c '#include "log.h"\nvoid low_log(void) { }\n'
put "$t" high/high.c '#include "low.h"\nvoid high(void) { low_log(); }\n'
build_tree "$t" && ordered "$t"
check "layers: another folder reaching a module's header through the umbrella passes" test $? -eq 0
put "$t" high/high.c '#include "log.h"\nvoid high(void) { low_log(); }\n'
check "layers: another folder including a module's header directly fails" \
    finds "check_layers: include of another folder's private header high/high -> low/log.h"

# The low folder's interface declares low_inner, which only low/ uses: its
# place is the folder's private header. A name a test uses (tests/) stays.
plant "$t" high,mid,low
put "$t" low/low.h '#define IPCC_HIDDEN\nIPCC_HIDDEN void low(void);\nIPCC_HIDDEN void low_inner(void);\n'
put "$t" low/low.c '#include "low.h"\nvoid low(void) { low_inner(); }\nvoid low_inner(void) { }\n'
check "layers: an interface declaring a name only its own folder uses fails" \
    finds "check_layers: low/low.h declares low_inner, which no other folder uses: its place is low/low_impl.h, or static"
mkdir -p "$t/tests" && printf 'void low(void), low_inner(void);\nint main(void) { low(); low_inner(); }\n' >"$t/tests/t.c"
build_tree "$t" && ordered "$t" --tests "$t/tests"
check "layers: the same name used by a test passes" test $? -eq 0

# Files a and b include the header two, whose inline code calls a; a calls b:
# the objects alone show a -> b only, the header makes it a circle.
plant "$t" high,mid,low
put "$t" low/two.h 'void a(void);\nvoid b(void);\nstatic inline void two(void) { a(); }\n'
put "$t" low/a.c '#include "two.h"\nvoid a(void) { b(); }\n'
put "$t" low/b.c '#include "two.h"\nvoid b(void) { }\n'
check "layers: a circle through a header's inline code fails" \
    finds 'check_layers: a circle through headers: low/a low/b low/two.h'

# Two files of one folder: a calls b, and b uses a's private header
# (a macro, so no call shows it): a circle between the files. With what
# both need in a header neither owns, one way.
plant "$t" high,mid,low
put "$t" low/a_impl.h '#define A_SIZE 4\nvoid b(void);\n'
put "$t" low/a.c '#include "a_impl.h"\nvoid a(void) { b(); }\n'
put "$t" low/b.c '#include "a_impl.h"\nint b_size[A_SIZE];\nvoid b(void) { }\n'
check "layers: a file using another's private header that calls it fails" \
    finds 'check_layers: a circle of files through their own headers: low/a low/b'
put "$t" low/shared_impl.h '#define A_SIZE 4\nvoid b(void);\n'
put "$t" low/a.c '#include "shared_impl.h"\nvoid a(void) { b(); }\n'
put "$t" low/b.c '#include "shared_impl.h"\nint b_size[A_SIZE];\nvoid b(void) { }\n'
rm "$t/src/low/a_impl.h"
build_tree "$t" && ordered "$t"
check "layers: the same files sharing a header neither owns pass" test $? -eq 0

plant "$t" high,mid
build_tree "$t" && ordered "$t"
check "layers: a folder not declared fails" grep -q 'folder low is not in' "$tmp/out"

tap_summary layers
