#!/usr/bin/env bash
#
# test_soak_gpu.sh - the GPU soak's own logic without a GPU (tools/bench/soak_gpu.py):
# the sampler on a real process tree (its rows, the command's exit status),
# the growth of synthetic series, and the verdict on made-up passes: flat
# ones hold; a growing fd count, more device memory, a wrong value or an
# engine error each fail the check that names it; missing files are a usage
# error.
#
# Prints "ok - NAME" / "not ok - NAME" per case and ends with the line
# "soak-gpu: N passed, M failed, K skipped"; exits non-zero on any failure.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$(dirname "$here")")
SOAK=$root/tools/bench/soak_gpu.py
PY=${PYTHON:-python3}

source "$root/tests/tap.sh"
tap_setup soak-gpu


# ---- the sampler -----------------------------------------------------------
# A parent with a child holding 20 extra fds: both are sampled; no GPU here,
# so the device's reading is -1.
PATH=$tmp/nogpu:$PATH "$PY" "$SOAK" sample --out "$tmp/sample.csv" --interval 0.2 -- \
    bash -c 'bash -c "exec 3<&0 4<&0 5<&0; sleep 1.2" & sleep 1.5; exit 3' >"$tmp/sample.out" 2>&1
expect_status "sample: the command's exit status is returned" $? 3
rows=$(grep -cE '^[0-9.]+,[0-9]+,[0-9]+,[0-9]+,$' "$tmp/sample.csv")
pids=$(grep -E '^[0-9.]+,[0-9]+,' "$tmp/sample.csv" | cut -d, -f2 | sort -u | wc -l)
if [[ $rows -ge 10 && $pids -ge 3 ]]; then ok "sample: rows for the command and its children"
else not_ok "sample: rows for the command and its children ($rows rows, $pids pids)"; fi
expect "sample: a device row per sample" "$tmp/sample.csv" '^[0-9.]+,device,,,-?[0-9]+$'
expect "sample: a device row after the command" "$tmp/sample.csv" '^[0-9.]+,device-after,,,-?[0-9]+$'
"$PY" "$SOAK" sample --out "$tmp/none.csv" >"$tmp/none.out" 2>&1
expect_status "sample: no command is a usage error" $? 2

# ---- growth ----------------------------------------------------------------
PYTHONPATH=$root/tools/bench "$PY" - >"$tmp/growth.out" 2>&1 <<'EOF'
import soak_gpu as s
flat = [(t, 1000) for t in range(100)]
assert s.growth(flat) == 0.0
ramp = [(t, 10 * t) for t in range(25, 101)]  # 10 a second
assert abs(s.growth(ramp) - 750) < 1e-6, s.growth(ramp)  # over its 75 s
alive = {t: 1 if t < 10 or t > 89 else 3 for t in range(100)}  # start-up, all alive, exit
assert s.steady(alive) == (10 + 79 * s.WARMUP_SHARE, 89), s.steady(alive)
early = [(t, 500 if t < 20 else 1000) for t in range(100)]  # a warm-up step, then flat
assert s.growth(s.within(early, s.steady(alive))) == 0.0
assert s.growth([]) == 0.0 and s.growth([(0, 1), (1, 2)]) == 0.0
assert s.steady({}) == (0.0, 0.0)
print("growth ok")
EOF
expect "growth: flat, a ramp, the steady part, too few points" "$tmp/growth.out" '^growth ok$'

# ---- the verdict -----------------------------------------------------------
# write_pass DIR NAME FDS_PER_S DEVICE_BYTES [JSON]: a 60 s pass of two processes.
write_pass() {
    "$PY" - "$@" <<'EOF'
import json, sys
d, name, fds_rate, device = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
with open(f"{d}/{name}.csv", "w") as f:
    f.write("t_s,pid,rss_bytes,fds,device_used_bytes\n")
    for t in range(60):
        for pid in (11, 12):
            f.write(f"{t},{pid},{400 << 20},{100 + int(fds_rate * t)},\n")
        f.write(f"{t},device,,,{device}\n")
    f.write(f"61,device-after,,,{1 << 30}\n")
result = {"alloc": "legacy", "error": None, "wrong_tensors": 0, "checked_tensors": 434}
result.update(extra)
json.dump({"kind": "sync", "results": [result]}, open(f"{d}/{name}.json", "w"))
EOF
}
verdict() {  # verdict CASE: report on $tmp/CASE; output in $tmp/CASE.out
    "$PY" "$SOAK" report "$tmp/$1" >"$tmp/$1.out" 2>&1
}
mkdir -p "$tmp/flat" "$tmp/leak" "$tmp/device" "$tmp/wrong" "$tmp/error" "$tmp/empty"
write_pass "$tmp/flat" soak_sync_legacy_without 0 $((20 << 30))
write_pass "$tmp/flat" soak_sync_legacy_with 0 $((20 << 30))
verdict flat
expect_status "verdict: flat passes hold" $? 0
expect "verdict: flat passes say so" "$tmp/flat.out" '^soak: every check held$'
expect "verdict: the processes counted both ways" "$tmp/flat.out" '\| sync \| legacy \| 2 / 2 \| rss flat \| yes'

write_pass "$tmp/leak" soak_sync_legacy_without 0 $((20 << 30))
write_pass "$tmp/leak" soak_sync_legacy_with 0.5 $((20 << 30))   # one fd every 2 s in each process
verdict leak
expect_status "verdict: a growing fd count fails" $? 1
expect "verdict: the fd check names it" "$tmp/leak.out" '\| fds flat \| \*\*no\*\*'

write_pass "$tmp/device" soak_serve_expandable_without 0 $((20 << 30))
write_pass "$tmp/device" soak_serve_expandable_with 0 $((21 << 30))   # 5% more
verdict device
expect_status "verdict: more device memory fails" $? 1
expect "verdict: the device check names it" "$tmp/device.out" '\| device memory \| \*\*no\*\*'

write_pass "$tmp/wrong" soak_sync_legacy_without 0 $((20 << 30))
write_pass "$tmp/wrong" soak_sync_legacy_with 0 $((20 << 30)) '{"wrong_tensors": 1}'
verdict wrong
expect_status "verdict: a wrong value fails" $? 1
expect "verdict: the wrong value is counted" "$tmp/wrong.out" '\| values \(with\) \| \*\*no\*\* \| 1 wrong of 434 checked'

write_pass "$tmp/error" soak_sync_legacy_without 0 $((20 << 30)) '{"error": "the engine died"}'
write_pass "$tmp/error" soak_sync_legacy_with 0 $((20 << 30))
verdict error
expect_status "verdict: an engine error fails" $? 1
expect "verdict: the error is shown" "$tmp/error.out" 'errors: the engine died'

verdict empty
expect_status "verdict: no files is a usage error" $? 2

tap_summary soak-gpu
