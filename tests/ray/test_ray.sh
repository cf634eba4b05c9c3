#!/usr/bin/env bash
#
# test_ray.sh - a Ray actor given the library by its runtime_env
# ({"env_vars": {"LD_PRELOAD": ...}}) on the stand-in driver
# (tests/ray/ray_actor.py): the library is mapped in the actor's own process,
# not in a task's worker without that runtime_env, and ipccache-stats shows
# the actor's hits.
#
# Ray: python3's if it imports ray, else RAY_PYTHON's; with
# IPCC_TEST_RAY_INSTALL=1 (CI) pip installs it into a virtual environment
# here. Without any of those it skips, saying how to get it.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup ray
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
TAP_SHOW="$tmp/out $tmp/err"
holder=
raydir=
tap_cleanup() {
    [[ -z $holder ]] || { exec 9>&-; wait "$holder" 2>/dev/null; }
    [[ -z $raydir ]] || rm -rf "$raydir"
}

finish() { tap_summary ray; exit; }
if [[ $build == *sanitize* ]]; then
    skip "ray: an actor's hits" "make test runs it (plain build)"
    finish
fi
py=
for candidate in "${RAY_PYTHON:-}" python3; do
    [[ -n $candidate ]] && "$candidate" -c 'import ray' 2>/dev/null && { py=$candidate; break; }
done
why="Ray is not installed (pip install ray, or IPCC_TEST_RAY_INSTALL=1 installs it here)"
if [[ -z $py && ${IPCC_TEST_RAY_INSTALL:-0} == 1 ]]; then
    python3 -m venv "$tmp/venv" >"$tmp/out" 2>"$tmp/err" &&
        "$tmp/venv/bin/pip" install -q ray >"$tmp/out" 2>"$tmp/err" && py=$tmp/venv/bin/python
    why="pip could not install Ray: $(tail -n 1 "$tmp/err")"
fi
if [[ -z $py ]]; then
    skip "ray: an actor's hits" "$why"
    finish
fi
if [[ ! -f $build/libipccache.so || ! -f $build/tests/libcuda.so.1 ]]; then
    not_ok "ray: $build/libipccache.so or the stand-in driver is not built"
    finish
fi

# The actor answers, then waits on its stdin (fd 9 here) while it is asked.
# Ray's files go to a short folder of this run: its sockets' paths, ~70 characters below it, must
# stay within AF_UNIX's 107 (the suite's own temporary folder is too deep for that).
mkfifo "$tmp/in"
raydir=$(mktemp -d /tmp/ray.XXXXXX)
RAY_TMPDIR=$raydir "$py" "$root/tests/ray/ray_actor.py" "$build/libipccache.so" "$build/tests" 10 \
    <"$tmp/in" >"$tmp/actor.json" 2>"$tmp/err" &
holder=$!
exec 9>"$tmp/in"
for _ in $(seq 600); do [[ -s $tmp/actor.json ]] && break; kill -0 "$holder" 2>/dev/null || break; sleep 0.1; done
field() { "$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$tmp/actor.json" "$1"; }
cp "$tmp/actor.json" "$tmp/out" 2>/dev/null
check "ray: the actor ran its opens and closes" test -s "$tmp/actor.json"
if [[ -s $tmp/actor.json ]]; then
    check "ray: runtime_env's LD_PRELOAD: the library is mapped in the actor's process" \
        test "$(field preloaded)" = True
    check "ray: a task without that runtime_env runs in a worker without it" \
        eval '[[ $(field plain_task) == *"'"'"'preloaded'"'"': False"* ]]'
    pid=$(field pid)
    python3 "$root/tools/ipccache-stats" --json "$pid" >"$tmp/out" 2>"$tmp/err"
    check "ray: ipccache-stats shows the actor's hits (10 opens, 1 map, 9 hits)" python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["processes"][0]
sys.exit(0 if (p["opens"], p["real_opens"], p["hits"]) == (10, 1, 9) else 1)' "$tmp/out"
fi
exec 9>&-
wait "$holder" 2>/dev/null
holder=
finish
