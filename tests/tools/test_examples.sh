#!/usr/bin/env bash
#
# test_examples.sh - examples/ without docker or a cluster: the Dockerfile
# parses (tests/tools/check_dockerfile.py, which must also catch a broken one),
# the pod fragment is valid YAML with the preload and the stats collection,
# and prometheus-textfile.sh publishes a real cached process's numbers.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup examples
holder=
tap_cleanup() { [[ -z $holder ]] || kill "$holder" 2>/dev/null; }
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
ex=$root/examples
TAP_SHOW="$tmp/out"

python3 "$root/tests/tools/check_dockerfile.py" "$ex/Dockerfile" >"$tmp/out" 2>&1
check "examples: the Dockerfile parses" test $? -eq 0
sed 's/^FROM /FRMO /' "$ex/Dockerfile" >"$tmp/Dockerfile.bad"
python3 "$root/tests/tools/check_dockerfile.py" "$tmp/Dockerfile.bad" >"$tmp/out" 2>&1
check "examples: the check refuses a misspelt instruction" grep -q "unknown instruction" "$tmp/out"

if python3 -c 'import yaml' 2>/dev/null; then
    python3 - "$ex/pod.yaml" >"$tmp/out" 2>&1 <<'PY'
import sys, yaml
pod = yaml.safe_load(open(sys.argv[1]))
server, sidecar = pod["spec"]["containers"]
env = {e["name"]: e["value"] for e in server["env"]}
assert pod["kind"] == "Pod" and pod["spec"]["shareProcessNamespace"]
assert env["LD_PRELOAD"].endswith("/libipccache.so"), env
assert "ipccache-stats" in " ".join(server["lifecycle"]["preStop"]["exec"]["command"])
assert "prometheus-textfile.sh" in " ".join(sidecar["command"])
PY
    check "examples: pod.yaml: preload, preStop stats, metrics sidecar" test $? -eq 0
else
    skip "examples: pod.yaml parses" "no YAML module for python3 (python3-yaml)"
fi

# A cached process (5 opens, 4 hits) that holds on, and the script once.
if [[ -x $build/tests/probe && -f $build/libipccache.so ]]; then
    mkdir -p "$tmp/metrics" "$tmp/req"
    LD_LIBRARY_PATH=$build/tests IPCCACHE_STATS_DIR=$tmp/req \
        LD_PRELOAD="${IPCC_TEST_PRELOAD_PREFIX:+$IPCC_TEST_PRELOAD_PREFIX:}$build/libipccache.so" \
        "$build/tests/probe" hold 5 30 >"$tmp/probe.out" 2>&1 &
    holder=$!
    for _ in $(seq 100); do grep -qx ready "$tmp/probe.out" && break; sleep 0.1; done
    PATH=$root/tools:$PATH sh "$ex/prometheus-textfile.sh" "$tmp/metrics" >"$tmp/out" 2>&1
    cp "$tmp/metrics/ipccache.prom" "$tmp/out" 2>/dev/null
    check "examples: prometheus-textfile.sh publishes the process's hits" \
        grep -q "^ipccache_hits_total{.*pid=\"$holder\".*} 4\$" "$tmp/metrics/ipccache.prom"
    check "examples: and leaves no temporary file" \
        eval '[[ $(ls -A "$tmp/metrics") == ipccache.prom ]]'
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
    holder=
else
    not_ok "examples: textfile: $build/tests/probe or the library is not built"
fi

# The start check, as the Dockerfile's RUN and the pod's startupProbe write it,
# with the built ipccache-config on the PATH: a bad value fails, good ones pass.
start_check() {  # NAME COMMAND...
    local name=$1; shift
    env PATH="$root/build:$PATH" IPCCACHE_MAX_IDLE_BYTES=16X "$@" >"$tmp/out" 2>&1
    check "examples: $name fails on a bad value (exit 1)" test $? -eq 1
    env PATH="$root/build:$PATH" IPCCACHE_MAX_IDLE_BYTES=16G "$@" >"$tmp/out" 2>&1
    check "examples: $name passes good values" test $? -eq 0
}
run_line=$(sed -n 's/^RUN \(ipccache-config .*\)$/\1/p' "$ex/Dockerfile")
check "examples: the Dockerfile runs the start check" test -n "$run_line"
[[ -n $run_line ]] && start_check "the Dockerfile's RUN $run_line" sh -c "$run_line"
if python3 -c 'import yaml' 2>/dev/null; then
    mapfile -t probe < <(python3 -c 'import sys, yaml
pod = yaml.safe_load(open(sys.argv[1]))
print("\n".join(pod["spec"]["containers"][0]["startupProbe"]["exec"]["command"]))' "$ex/pod.yaml")
    check "examples: pod.yaml's startupProbe is ipccache-config --check" \
        test "${probe[*]:-}" = "ipccache-config --check"
    (( ${#probe[@]} )) && start_check "the startupProbe" "${probe[@]}"
fi

tap_summary examples
