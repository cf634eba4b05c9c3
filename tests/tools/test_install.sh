#!/usr/bin/env bash
#
# test_install.sh - make install puts the library, the tools and the man
# page under DESTDIR/PREFIX; make uninstall removes them and exactly the
# folders the install made, never one that was there before.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"
tap_setup install
TAP_SHOW="$tmp/out"
if [[ ${IPCC_TEST_BUILD:-build} == *sanitize* ]]; then
    skip "install" "make test installs the plain build"
    tap_summary install
    exit
fi

# make TARGET DESTDIR: quietly, with the plain build.
run_make() { make --no-print-directory -C "$root" "$1" DESTDIR="$2" PREFIX=/usr/local >"$tmp/out" 2>&1; }

dest=$tmp/fresh
mkdir "$dest"
run_make install "$dest"
check "install: into an empty DESTDIR" test $? -eq 0
for f in lib/libipccache.so bin/ipccache-run bin/ipccache-stats bin/ipccache-config \
    share/man/man7/ipccache.7; do
    check "install: $f" test -f "$dest/usr/local/$f"
done
run_make uninstall "$dest"
rc=$?
check "uninstall: removes the files and every folder it made, the prefix's own included" \
    eval '[[ $rc == 0 && ! -e $dest/usr && -d $dest ]]'

# Folders that were there before stay, with what else they hold.
dest=$tmp/shared
mkdir -p "$dest/usr/local/bin" "$dest/usr/local/share/man"
touch "$dest/usr/local/bin/other-tool"
run_make install "$dest" && run_make uninstall "$dest"
check "uninstall: keeps folders that existed, and their other files" \
    eval '[[ -f $dest/usr/local/bin/other-tool && -d $dest/usr/local/share/man &&
             ! -e $dest/usr/local/lib && ! -e $dest/usr/local/share/man/man7 &&
             ! -e $dest/usr/local/share/ipccache ]]'

# A GPU host without network: with the library built, make bench and
# make test-gpu start at once, without the prerequisite check (uthash).
if [[ -f $root/build/libipccache.so ]]; then
    make --no-print-directory -C "$root" -n test-gpu bench >"$tmp/out" 2>&1
    check "make test-gpu, make bench: a built library needs no prerequisite check" \
        eval '! grep -q setup.sh "$tmp/out"'
fi

tap_summary install
