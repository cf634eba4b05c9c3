#!/usr/bin/env bash
#
# test_wheel.sh - the pip wheel: make wheel builds it (pip fetches the build
# backend, hatchling), auditwheel finds it consistent with its manylinux
# tag, and installed into a fresh virtual environment it works: the console
# scripts (every command the README names), python -m ipccache,
# ipccache.library_path(), and one cached open through the stand-in driver
# with the installed library.
#
# Run by make test (build); under make test-sanitize it is skipped, the
# wheel being the plain build. Without access to the package index it skips
# the steps that need it and says so.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

build=${IPCC_TEST_BUILD:-build}
if [[ $build == *sanitize* ]]; then
    skip "wheel" "make test builds and tests the wheel (plain build)"
    tap_summary wheel
    exit
fi

tap_setup wheel
PY=${PYTHON:-python3}
TAP_SHOW="$tmp/out $tmp/err"

# A cross compiler that is not installed: make says so and names its package.
CC=$tmp/none/aarch64-linux-gnu-gcc make --no-print-directory -C "$root" wheel BUILD="$tmp/none" \
    >"$tmp/out" 2>"$tmp/err"
cc_rc=$?
check "wheel: a missing CC is named with its Debian package" eval '[[ $cc_rc != 0 ]] && grep -qF \
"the C compiler $tmp/none/aarch64-linux-gnu-gcc is not installed (or does not run); on Debian or Ubuntu: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross" "$tmp/err"'
offline='Could not find a version|NewConnectionError|Network is unreachable|Temporary failure in name resolution|No matching distribution'

# The tag the library's glibc needs allow (see shim/base/glibc_floor.h).
arch=$(uname -m)
want_tag=manylinux_2_17_$arch

make --no-print-directory -C "$root" wheel BUILD="$tmp" >"$tmp/out" 2>"$tmp/err"
rc=$?
wheel=$(ls "$tmp"/dist/ipccache-*.whl 2>/dev/null | head -n 1)
if [[ $rc -ne 0 ]] && grep -qE "$offline" "$tmp/out" "$tmp/err"; then
    skip "wheel: make wheel" "the package index cannot be reached (pip needs hatchling)"
    tap_summary wheel
    exit
fi
check "wheel: make wheel builds it" test "$rc" -eq 0 -a -n "$wheel"
if [[ -z $wheel ]]; then
    tap_summary wheel
    exit
fi
check "wheel: tagged py3-none-$want_tag" test "$(basename "$wheel")" = "ipccache-0.1.0-py3-none-$want_tag.whl"

venv=$tmp/venv
"$PY" -m venv "$venv" >"$tmp/out" 2>"$tmp/err"
check "wheel: a fresh virtual environment" test -x "$venv/bin/pip"
"$venv/bin/pip" install -q --no-index --no-deps "$wheel" >"$tmp/out" 2>"$tmp/err"
check "wheel: installs without the index" test $? -eq 0

if "$venv/bin/pip" install -q auditwheel >"$tmp/out" 2>"$tmp/err"; then
    "$venv/bin/auditwheel" show "$wheel" >"$tmp/out" 2>"$tmp/err"
    # It wraps its lines.
    check "wheel: auditwheel show: consistent with $want_tag" eval 'tr -s " \n" " " <"$tmp/out" |
        grep -qF "consistent with the following platform tag: \"$want_tag\""'
else
    skip "wheel: auditwheel show" "auditwheel could not be installed"
fi

"$venv/bin/ipccache-run" /bin/echo hi >"$tmp/out" 2>"$tmp/err"
rc=$?
check "wheel: ipccache-run /bin/echo hi" eval '[[ $rc == 0 && $(cat "$tmp/out") == hi && ! -s "$tmp/err" ]]'
site_lib=$("$venv/bin/python" -m ipccache lib 2>"$tmp/err")
check "wheel: python -m ipccache lib is the installed library" \
    eval '[[ $site_lib == "$venv"/lib/python*/site-packages/ipccache/lib/libipccache.so && -f $site_lib ]]'
api_lib=$("$venv/bin/python" -c 'import ipccache; print(ipccache.library_path())' 2>"$tmp/err")
check "wheel: ipccache.library_path() agrees" test "$api_lib" = "$site_lib"
"$venv/bin/python" -m ipccache run --version >"$tmp/out" 2>"$tmp/err"
check "wheel: python -m ipccache run" grep -q '^ipccache-run ' "$tmp/out"
"$venv/bin/python" -m ipccache bogus >"$tmp/out" 2>"$tmp/err"
bogus_rc=$?
check "wheel: python -m ipccache bogus names the unknown command (exit 2)" \
    eval '[[ $bogus_rc == 2 ]] && grep -qx "ipccache: unknown command .bogus." "$tmp/err"'
check "wheel: the man page is in the environment's share/man" \
    test -f "$venv/share/man/man7/ipccache.7"
if command -v man >/dev/null 2>&1; then
    check "wheel: man finds ipccache(7) from the environment's bin/" \
        eval '[[ $(PATH="$venv/bin:$PATH" MANPATH= man -w ipccache 2>/dev/null) == "$venv"/share/man/man7/ipccache.7* ]]'
fi
check "wheel: the library is stripped (no debug information)" \
    eval '! readelf -S --wide "$site_lib" | grep -q "\.debug_info"'
"$venv/bin/ipccache-stats" --version >"$tmp/out" 2>"$tmp/err"
rc=$?
check "wheel: ipccache-stats" eval '[[ $rc == 0 && -s "$tmp/out" ]]'
# Every command the README names, on the environment's PATH, and every
# python -m ipccache command it lists ("python -m ipccache run|stats|...").
for cmd in $(grep -oE '`ipccache-[a-z]+' "$root/README.md" | tr -d '`' | sort -u); do
    PATH="$venv/bin:/usr/bin:/bin" "$cmd" --help >"$tmp/out" 2>"$tmp/err"
    rc=$?
    check "wheel: $cmd --help from the environment's bin/ (the README names it)" \
        eval '[[ $rc == 0 && -s "$tmp/out" && -x $venv/bin/$cmd ]]'
done
subs=$(grep -oE 'python -m ipccache [a-z|]+' "$root/README.md" | grep '|' | head -n 1 | cut -d' ' -f4)
check "wheel: the README lists python -m ipccache's commands" test -n "$subs"
for sub in ${subs//|/ }; do
    [[ $sub == lib ]] && continue   # checked above: it takes no option
    "$venv/bin/python" -m ipccache "$sub" --help >"$tmp/out" 2>"$tmp/err"
    rc=$?
    check "wheel: python -m ipccache $sub --help" eval '[[ $rc == 0 && -s "$tmp/out" ]]'
done
env IPCCACHE_MAX_IDLE_BYTES=16X "$venv/bin/ipccache-config" --check >"$tmp/out" 2>"$tmp/err"
check "wheel: ipccache-config --check fails on a bad value (exit 1)" test $? -eq 1
env IPCCACHE_MAX_IDLE_BYTES=banana "$venv/bin/ipccache-run" --strict /bin/true >"$tmp/out" 2>"$tmp/err"
check "wheel: ipccache-run checks settings with the packaged ipccache-config" test $? -eq 78

# The other architecture's wheel, cross-built where the cross compiler is.
cross=aarch64-linux-gnu-gcc other=aarch64
[[ $arch == aarch64 ]] && cross=x86_64-linux-gnu-gcc other=x86_64
if command -v "$cross" >/dev/null 2>&1; then
    CC=$cross make --no-print-directory -C "$root" wheel BUILD="$tmp/$other" >"$tmp/out" 2>"$tmp/err"
    check "wheel: $other wheel (CC=$cross) tagged py3-none-manylinux_2_17_$other" \
        test -f "$tmp/$other/dist/ipccache-0.1.0-py3-none-manylinux_2_17_$other.whl"
    if [[ -x $venv/bin/auditwheel ]]; then
        "$venv/bin/auditwheel" show "$tmp/$other"/dist/*.whl >"$tmp/out" 2>"$tmp/err"
        check "wheel: auditwheel show: $other consistent with manylinux_2_17_$other" eval 'tr -s " \n" " " \
            <"$tmp/out" | grep -qF "consistent with the following platform tag: \"manylinux_2_17_$other\""'
    fi
else
    skip "wheel: $other wheel" "no $cross (make test-aarch64 installs it)"
fi

# The main job: opens of one handle under the installed library hit the cache.
[[ $build == /* ]] || build=$root/$build
probe=$build/tests/probe
if [[ -x $probe && -f $site_lib ]]; then
    LD_LIBRARY_PATH=$build/tests LD_PRELOAD=$site_lib IPCCACHE_STATS_AT_EXIT=1 \
        IPCCACHE_STATS_FILE="$tmp/stats" "$probe" openclose 5 >"$tmp/out" 2>"$tmp/err"
    check "wheel: a cached open through the stand-in driver (1 map for 5 opens)" \
        eval 'grep -qx "maps=1" "$tmp/out" && grep -q "\"hits\":4," "$tmp/stats"'
else
    not_ok "wheel: cached open: $probe is not built"
fi

tap_summary wheel
