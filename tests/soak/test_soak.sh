#!/usr/bin/env bash
#
# test_soak.sh - the stand-in soak's own logic (make soak, tests/soak/), no GPU:
# the slope test on synthetic series (a flat noisy one, a bounded sawtooth and
# a step inside the warm-up pass; a slow leak and a fast one fail; a series
# that moved by less than its quantum passes however few the opens); then a
# short fleet run with faults planted under the library
# (tests/soak/soak_plant.c): a wrong pointer from one real open must be
# reported as wrong values, a build that keeps one fd per miss as a growing
# fd series, and one whose real closes unmap nothing as freed memory kept
# mapped, while the same fleet without a plant reports none of them.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup soak
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
soak=$build/tests/soak
lib=$build/libipccache.so
plant=$build/tests/libsoakplant.so
here=$root/tests/soak
# The sanitizer run: the ASan runtime must be loaded before the library.
prefix=${IPCC_TEST_PRELOAD_PREFIX:+$IPCC_TEST_PRELOAD_PREFIX }

slope() {
    python3 - "$here" "$@" <<'PY'
import math, random, sys
sys.path.insert(0, sys.argv[1])
from soak_verdict import slope_test
kind = sys.argv[2]
random.seed(7)
pts = []
for i in range(120):
    opens = 50000 * i
    if kind == "flat":
        y = 3000 + random.randint(-40, 40)
    elif kind == "sawtooth":
        y = 20 + (i % 17)
    elif kind == "leak":
        y = 30 + opens // 20000          # one fd per 20,000 opens: 50 per million
    elif kind == "slow-leak":
        y = 3000 + 2 * opens / 1e4       # 200 KiB per million opens
    elif kind == "small":
        y = 10 + (1 if i > 60 else 0)    # moved by one: its quantum is 2
        opens = 100 * i
    elif kind == "held-a-moment":        # freed memory mapped until a close, more and more of it
        y = 0 if i % 5 else 64 * i
    elif kind == "kept":                 # ... and a part never given back
        y = (0 if i % 5 else 64 * i) + 8 * i
    elif kind == "flat-under-hits":      # millions of hits a second, nothing kept
        y = 40 + random.randint(-3, 3)
        opens = 1e7 * i
    elif kind == "leak-under-hits":      # one kept per exporter's death, hidden by the hits
        y = 40 + i // 10                 # 0.01 per million opens, a rise of 11
        opens = 1e7 * i
    pts.append((float(i), float(opens), float(y)))
bound, quantum = {"flat": (64, 256), "slow-leak": (64, 256)}.get(kind, (1, 2))
if kind.endswith("-under-hits"):         # judged by its rise alone
    bound, quantum = None, 8
mode = "floor" if kind in ("held-a-moment", "kept") else "peak"
growth, rise, ok = slope_test(pts, bound, quantum, mode)
sys.exit(0 if ok == (kind in ("flat", "sawtooth", "small", "held-a-moment", "flat-under-hits")) else 1)
PY
}

# rows (t, ghost bytes the stand-in counts, the library's in-use part of them)
idle_ghost() {
    python3 - "$here" "$1" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from soak_verdict import longest_idle_ghost, IDLE_GHOST_SECONDS
kind = sys.argv[2]
rows = []
for t in range(60):
    ghost = 256 << 20 if (kind == "kept" and 20 <= t < 45) or t % 7 == 0 else 0
    doomed = ghost if kind == "in-use" else 0
    if kind == "in-use":                 # the program holds it for 30 s: the library counts it
        ghost = doomed = (256 << 20) if 10 <= t < 40 else 0
    rows.append({"t_s": str(float(t)), "ghost_bytes": str(ghost), "lib_ghost_bytes": str(doomed)})
seconds, _ = longest_idle_ghost(rows)
sys.exit(0 if (seconds > IDLE_GHOST_SECONDS) == (kind == "kept") else 1)
PY
}
check "idle ghosts: let go within a second each time passes" idle_ghost brief
check "idle ghosts: memory the program holds for 30 s passes" idle_ghost in-use
check "idle ghosts: a dead exporter's pool kept idle 25 s fails" idle_ghost kept

for k in flat sawtooth small held-a-moment flat-under-hits; do
    check "slope test: a $k series passes" slope "$k"
done
for k in leak slow-leak kept leak-under-hits; do
    check "slope test: a $k fails" slope "$k"
done

if [[ ! -x $soak || ! -f $plant ]]; then
    not_ok "soak: $soak and $plant are built"
    tap_summary soak
    exit
fi

# A fleet of 2 exporters and 3 importers for 14 s (10 s of warm-up): steady
# exporters (the plants are what is judged here).
fleet() {
    local out=$1 preload=$2
    shift 2
    env SOAK_STEADY=1 "$@" "$soak" run "$out" 14 3 2 3 "$preload" >"$out.log" 2>&1 &&
        python3 "$here/soak_verdict.py" --min-span 0 "$out" >"$out.verdict" 2>&1
    return 0
}
fleet "$tmp/clean" "$prefix$lib"
fleet "$tmp/wrong" "$prefix$lib $plant" SOAK_PLANT=wrong-value SOAK_PLANT_AT=50
fleet "$tmp/leak" "$prefix$lib $plant" SOAK_PLANT=leak-fd
fleet "$tmp/keep" "$prefix$lib $plant" SOAK_PLANT=keep-mapping

TAP_SHOW="$tmp/clean.verdict $tmp/clean.log"
check "soak: the fleet checks values and return codes" grep -qE 'checks, wrong values 0, return codes off the model 0' "$tmp/clean.verdict"
check "soak: no planted fault, no growing fd series" bash -c "! grep -q 'fds grows' '$tmp/clean.verdict'"
check "soak: no planted fault, no freed memory kept mapped" bash -c "! grep -q 'ghost_bytes grows' '$tmp/clean.verdict'"
check "soak: no planted fault, nothing of dead exporters kept idle" bash -c "! grep -q 'memory idle for' '$tmp/clean.verdict'"
TAP_SHOW="$tmp/wrong.verdict"
check "soak: a planted wrong value is reported" grep -qE 'FAIL: with: [1-9][0-9]* wrong values' "$tmp/wrong.verdict"
check "soak: a planted wrong value fails the verdict" grep -q 'verdict: FAIL' "$tmp/wrong.verdict"
TAP_SHOW="$tmp/leak.verdict"
# A fast fleet may reach its limit of open files within the 14 s: that is
# reported instead of the slope (an importer at its limit fails on its own).
check "soak: a planted fd per miss is reported as growing" \
    grep -qE 'FAIL: with importer [0-9]+ (fds grows|reached its limit of open files)' "$tmp/leak.verdict"
TAP_SHOW="$tmp/keep.verdict"
check "soak: a planted close that unmaps nothing is reported as freed memory kept mapped" \
    grep -qE 'FAIL: with (importer [0-9]+|machine) ghost_bytes grows' "$tmp/keep.verdict"
tap_summary soak
