#!/usr/bin/env bash
#
# test_gpu_skip.sh - the GPU targets on a machine without a GPU (an
# nvidia-smi that fails, as without a driver, first on the PATH): each says
# it skipped and exits 77, so a job meant to run them does not pass; make
# stops on it. (No $name in a check: it is check's own local.)

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup gpu-skip
TAP_SHOW="$tmp/out"
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
mkdir -p "$tmp/nogpu"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed" >&2\nexit 9\n' >"$tmp/nogpu/nvidia-smi"
chmod +x "$tmp/nogpu/nvidia-smi"
nogpu() { env PATH="$tmp/nogpu:$PATH" IPCCACHE_LIB="$build/libipccache.so" "$@" >"$tmp/out" 2>&1; }

for target in test-gpu:tests/gpu/run.sh peer:tools/peer_suites.sh; do
    what=${target%%:*} script=${target#*:}
    (cd "$root" && nogpu bash "$script")
    rc=$?
    check "$what: $script exits 77 without a GPU" eval '[[ $rc == 77 ]] && grep -qx \
"$what: no NVIDIA GPU found; skipped (exit status 77)" "$tmp/out"'
done
if [[ -f $build/libipccache.so ]]; then
    for target in test-gpu bench peer; do
        nogpu make --no-print-directory -C "$root" BUILD="$build" "$target"
        rc=$?
        check "make $target: says it skipped, and make stops on status 77" eval '[[ $rc != 0 ]] &&
grep -qx "$target: no NVIDIA GPU found; skipped (exit status 77)" "$tmp/out" &&
grep -q "Error 77" "$tmp/out" && ! grep -q "^$target: .*skipping" "$tmp/out"'
    done
else
    not_ok "make test-gpu, bench, peer: $build/libipccache.so is not built"
fi

tap_summary gpu-skip
