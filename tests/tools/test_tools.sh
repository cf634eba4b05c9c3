#!/usr/bin/env bash
#
# test_tools.sh - tests of the operator tools, tools/ipccache-run and
# tools/ipccache-stats. Needs no GPU and not the real library:
#
#  - ipccache-stats is pointed at fake targets, small Python processes that
#    map a file named like the library (IPCCACHE_STATS_LIBNAME), leave the
#    library's marker and answer the stats signal the way libipccache.so
#    does (see ipccache(7)); the end-to-end cases use the real library;
#  - ipccache-run preloads a harmless shared object: the stand-in driver
#    build/tests/libcuda.so.1 when it is built, else one compiled here.
#
# Prints "ok - NAME" / "not ok - NAME" per case and ends with the line
# "tools: N passed, M failed, K skipped"; exits non-zero on any failure.
#
# Each case (new_case) sees only its own processes and files: the fakes of
# the case before are killed and reaped, and it gets a fresh private
# XDG_RUNTIME_DIR (where markers and request files go). Everything lives in
# one temporary folder, removed at the end.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$(dirname "$here")")
RUN_TOOL="$root/tools/ipccache-run"
STATS_TOOL="$root/tools/ipccache-stats"
PY=${PYTHON:-python3}
# The interpreter itself, not a wrapper script: quicker, and it must also run
# as another user below.
PY=$("$PY" -c 'import sys; print(sys.executable)') || exit 1
LIMIT=10  # seconds any one command may take

# The caller's settings must not leak into the fakes or the expected output.
unset LD_PRELOAD
while read -r name; do unset "$name"; done < <(compgen -e | grep '^IPCCACHE_')

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ipccache-tools.XXXXXX") || exit 1
tmp=$(cd "$tmp" && pwd -P)
# Fakes may run as another user (see the ownership case): let them in.
chmod 755 "$tmp"
mkdir -m 1777 "$tmp/run"

fake_pids=()

cleanup() {
    stop_fakes
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The case helpers (ok, not_ok, skip, check): on failure a case shows the
# output of the last tool run, as TAP comments.
source "$root/tests/tap.sh"
TAP_SHOW="$tmp/out $tmp/err"

# Tool runs, bounded in time. Output goes to $tmp/out and $tmp/err; the
# exit status to $rc.
rc=0
stats() {
    IPCCACHE_STATS_LIBNAME=$LIBNAME timeout "$LIMIT" "$PY" "$STATS_TOOL" "$@" \
        >"$tmp/out" 2>"$tmp/err"
    rc=$?
}
run_tool() {
    timeout "$LIMIT" "$RUN_TOOL" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}

rc_is() { [[ $rc == "$1" ]]; }
out_has() { grep -qF -- "$1" "$tmp/out"; }
err_has() { grep -qF -- "$1" "$tmp/err"; }
alive() { kill -0 "$1" 2>/dev/null; }
py() { timeout "$LIMIT" "$PY" "$@"; }

# ---------------------------------------------------------------------------
# Fake targets

# Named for this run only: a tool of another run on the same machine that
# looks for processes by the library's name must not find these fakes.
LIBNAME=libfake-ipccache-$$.so
printf 'not really a library\n' >"$tmp/$LIBNAME"

cat >"$tmp/fake_target.py" <<'EOF'
# A stand-in for a process running with libipccache.so: maps a file named
# like the library and, unless --no-handler, installs a handler for the
# stats signal and leaves the library's marker in
# $XDG_RUNTIME_DIR/ipccache. The handler appends one JSON line where the
# library would: IPCCACHE_STATS_FILE (%p expanded), else an existing
# request file <IPCCACHE_STATS_DIR or the per-user folder>/ipccache-<pid>.stats,
# else stderr.
#   --no-marker     a program using the signal for itself: handler, no
#                   marker; the signal makes it exit 3
#   --stale-marker  a marker with another start time (a reused pid); the
#                   signal makes it exit 3
#   --exec-marker   a marker left before an exec: the library is not at its
#                   base; the signal makes it exit 3
#   --grow          the stats file grows by 16 GiB (sparse) before the line
import json, mmap, os, signal, sys

ready, base = sys.argv[1], int(sys.argv[2])
opts = sys.argv[3:]
signal.alarm(120)  # never outlive a broken test run
user_dir = os.environ["XDG_RUNTIME_DIR"] + "/ipccache"

def stats_line():
    d = {"schema": 1, "pid": os.getpid(), "version": "0.1.0",
         "opens": 10 * base, "hits": 8 * base, "misses": 2 * base,
         "closes": 10 * base, "real_opens": 2 * base, "real_closes": 0,
         "live": 0, "idle": 2 * base, "idle_bytes": base << 30,
         "evictions": base, "invalidations": 0, "passthrough": 0,
         "errors": 0, "saved_ms": 0.8 * base, "max_idle_bytes": 8 << 30,
         "vmm_imports": 30 * base, "vmm_import_hits": 29 * base, "vmm_maps": 30 * base,
         "vmm_map_hits": 28 * base,
         "max_idle_entries": 256, "future_counter": 7 * base}
    if base == 1:  # the optional keys, present in one fake only
        d.update(open_ns_mean=61900, close_ns_mean=36000,
                 top=[{"ctx": 1, "hits": 8, "refs": 0, "bytes": 1 << 29, "age_ms": 5}])
    if "--garbage" in opts:
        return b"{this is not json\n"
    return (json.dumps(d) + "\n").encode()

stats_file = os.environ.get("IPCCACHE_STATS_FILE", "").replace("%p", str(os.getpid()))
request_dir = os.environ.get("IPCCACHE_STATS_DIR") or user_dir

def destination():
    flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOFOLLOW
    try:
        if stats_file:
            return os.open(stats_file, flags | os.O_CREAT, 0o600)
        return os.open("%s/ipccache-%d.stats" % (request_dir, os.getpid()), flags)
    except OSError:
        return 2

def answer(signo, frame):
    if "--no-marker" in opts or "--stale-marker" in opts or "--exec-marker" in opts:
        os._exit(3)
    if "--silent" in opts:
        return
    fd = destination()
    if "--grow" in opts:
        os.ftruncate(fd, os.fstat(fd).st_size + (16 << 30))
        os.write(fd, b"\n")
    os.write(fd, stats_line())
    if fd != 2:
        os.close(fd)

def library_base():
    # Where the file named like the library is mapped (else any mapping).
    maps = open("/proc/self/maps").read().splitlines()
    mine = [l for l in maps if l.endswith("/" + os.environ["LIBNAME"])] or maps
    return int(mine[0].split("-")[0], 16)

def write_marker(signo):
    stat = open("/proc/self/stat", "rb").read()
    start = int(stat[stat.rfind(b")") + 2:].split()[19])
    base = library_base()
    if "--stale-marker" in opts:
        start += 1
    if "--exec-marker" in opts:
        base = 4096  # never a mapping: below mmap_min_addr
    os.makedirs(user_dir, mode=0o700, exist_ok=True)
    with open("%s/ipccache-%d.marker" % (user_dir, os.getpid()), "w") as f:
        f.write("ipccache-marker 1\npid=%d\nstart=%d\nsignal=%d\nbase=%d\nstats_file=%s\n"
                "request_dir=%s\n" % (os.getpid(), start, signo, base, stats_file, request_dir))

if "--comm" in opts:
    with open("/proc/self/comm", "w") as f:
        f.write(opts[opts.index("--comm") + 1])
if "--lib" in opts:
    lib_file = open(opts[opts.index("--lib") + 1], "rb")
    lib_map = mmap.mmap(lib_file.fileno(), 0, prot=mmap.PROT_READ)
name = os.environ.get("IPCCACHE_STATS_SIGNAL", "USR1").upper()
if "--no-handler" not in opts and name != "0":
    signo = getattr(signal, name if name.startswith("SIG") else "SIG" + name)
    signal.signal(signo, answer)
    if "--no-marker" not in opts:
        write_marker(int(signo))
open(ready, "w").close()
while True:
    signal.pause()
EOF

# start_fake BASE [--lib FILE] [--no-handler] [--no-marker] [--stale-marker]
#            [--exec-marker] [--grow] [--silent] [--garbage] [--comm NAME]
# Starts a fake (with the caller's temporary environment) and waits until it
# is ready; its pid is left in $fake.
fake=
fake_seq=0
start_fake() {
    local ready="$tmp/run/ready.$((++fake_seq))"
    LIBNAME=$LIBNAME "$PY" "$tmp/fake_target.py" "$ready" "$@" 2>>"$tmp/fake.err" &
    fake=$!
    fake_pids+=("$fake")
    wait_for_file "$ready"
}
wait_for_file() {
    local i
    for ((i = 0; i < 200; i++)); do
        [[ -e $1 ]] && return 0
        sleep 0.05
    done
    echo "# fake target did not start:" >&2
    sed 's/^/#   /' "$tmp/fake.err" | tail -n 5 >&2
    return 1
}
# Kills and reaps every process the cases started.
stop_fakes() {
    local pid
    for pid in "${fake_pids[@]+"${fake_pids[@]}"}"; do
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    fake_pids=()
}

# new_case: the processes of the case before are gone; a fresh per-user
# folder ($XDG_RUNTIME_DIR, 0700) in a fresh case folder ($case, which other
# users may cross).
case_no=0
case=
new_case() {
    stop_fakes
    [[ -n $case ]] && rm -rf "$case"
    case=$tmp/case.$((++case_no))
    mkdir -m 711 "$case"
    mkdir -m 700 "$case/xdg"
    export XDG_RUNTIME_DIR=$case/xdg
}
userdir() { echo "$XDG_RUNTIME_DIR/ipccache"; }
no_stats_files() { ! compgen -G "$(userdir)/*.stats" >/dev/null; }
lib="$tmp/$LIBNAME"

# Checks Prometheus text exposition rules on stdin: argv[1] is a comm that
# must appear, unescaped, as a label value.
cat >"$tmp/check_prom.py" <<'EOF'
import re, sys
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(r"^(%s)(?:\{(%s(?:,%s)*)\})? (\S+)$" % (NAME, LABEL, LABEL))
helped, typed, finished, comms = set(), {}, set(), set()
current = None
def fail(msg, line):
    sys.exit("%s: %r" % (msg, line))
for line in sys.stdin.read().splitlines():
    if not line:
        continue
    m = re.match(r"^# (HELP|TYPE) (%s) (.+)$" % NAME, line)
    if m:
        kind, name, rest = m.groups()
        if kind == "HELP":
            if name in helped: fail("second HELP", line)
            helped.add(name)
        else:
            if name in typed: fail("second TYPE", line)
            if rest not in ("counter", "gauge", "untyped", "summary", "histogram"):
                fail("bad type", line)
            if rest == "counter" and not name.endswith("_total"):
                fail("counter without _total", line)
            typed[name] = rest
        continue
    if line.startswith("#"):
        fail("stray comment", line)
    m = SAMPLE.match(line)
    if not m: fail("not a sample", line)
    name, value = m.group(1), line.rsplit(" ", 1)[1]
    if name not in helped or name not in typed: fail("no HELP/TYPE before", line)
    if name != current:
        if name in finished: fail("samples of a metric not together", line)
        if current: finished.add(current)
        current = name
    float(value)  # raises on a non-number
    for lname, lvalue in re.findall(LABEL, line[len(name):]):
        if lname == "comm":
            comms.add(re.sub(r"\\(.)", lambda c: {"n": "\n"}.get(c.group(1), c.group(1)), lvalue))
if len(sys.argv) > 1 and sys.argv[1] not in comms:
    sys.exit("comm %r not found among %r" % (sys.argv[1], comms))
for needed in ("ipccache_opens_total", "ipccache_hits_total", "ipccache_idle_bytes",
               "ipccache_live_entries", "ipccache_saved_seconds_total"):
    if needed not in typed: sys.exit("missing " + needed)
EOF

# Reads the JSON document in $tmp/out and evaluates a Python expression on it
# (as "doc"); true if the expression is.
json_true() {
    py -c 'import json, sys
doc = json.load(open(sys.argv[1]))
sys.exit(0 if eval(sys.argv[2]) else 1)' "$tmp/out" "$1"
}

# ---------------------------------------------------------------------------
# ipccache-stats: usage

stats; check "stats: no arguments is a usage error (2)" rc_is 2
stats --all 123; check "stats: --all with PIDs is a usage error" rc_is 2
stats --json --prometheus 123; check "stats: --json with --prometheus is a usage error" rc_is 2
stats --watch 0 123; check "stats: --watch 0 is a usage error" rc_is 2
stats --timeout abc 123; check "stats: --timeout abc is a usage error" rc_is 2
stats --bogus 123; check "stats: an unknown option is a usage error" rc_is 2
check "stats: usage messages start with the tool name" grep -q '^ipccache-stats: ' "$tmp/err"
stats --help; check "stats: --help exits 0" rc_is 0
stats --version; check "stats: --version" out_has "ipccache-stats "

# ---------------------------------------------------------------------------
# ipccache-stats: one process, request file in the per-user folder

new_case
start_fake 1 --lib "$lib" --comm fakeone
env -u COLUMNS IPCCACHE_STATS_LIBNAME=$LIBNAME "$PY" "$STATS_TOOL" "$fake" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "stats: table for one process exits 0" rc_is 0
check "stats: table shows pid and command" grep -qE "^ *$fake +fakeone " "$tmp/out"
check "stats: to a pipe, the main columns: opens, hits, rate, VMM hits, saved, idle, VMM calls, real opens" \
    eval '[[ $(head -n 1 "$tmp/out" | xargs) == "PID COMMAND OPENS HITS HIT% REAL_OPENS VMM_IMPORTS VMM_IMPORT_HITS VMM_MAPS VMM_MAP_HITS IDLE_BYTES SAVED_MS" ]] &&
    grep -qE "fakeone +10 +8 +80\.0 +2 +30 +29 +30 +28 +1\.0G +0\.8$" "$tmp/out"'
for cols in 80 60; do
    COLUMNS=$cols stats "$fake"
    check "stats: COLUMNS=$cols: the table fits" eval '[[ $(awk "length > $cols" "$tmp/out") == "" ]]'
done
COLUMNS=20 stats "$fake"
check "stats: COLUMNS=20: PID, COMMAND and HITS however narrow" \
    eval '[[ $(head -n 1 "$tmp/out" | xargs) == "PID COMMAND HITS" ]]'
COLUMNS=80 stats "$fake"
check "stats: COLUMNS=80 keeps hits, rate, the VMM hits and the time saved" eval \
    '[[ $(head -n 1 "$tmp/out" | xargs) == "PID COMMAND OPENS HITS HIT% VMM_IMPORT_HITS VMM_MAP_HITS SAVED_MS" ]]'
COLUMNS=80 stats --wide "$fake"
check "stats: --wide: every column, whatever COLUMNS says" eval '[[ $(head -n 1 "$tmp/out" | wc -w) == 18 ]] &&
    grep -qE "fakeone +10 +8 +80\.0 +2 +2 +0 +30 +29 +30 +28 +0 +2 +1\.0G +1 +0 +0\.8$" "$tmp/out"'
COLUMNS=wide stats "$fake"
check "stats: a COLUMNS that is not a number is ignored" eval '[[ $(head -n 1 "$tmp/out" | wc -w) == 12 ]]'
stats --wide --json "$fake"
check "stats: --wide goes with the table only" rc_is 2
check "stats: no TOTAL row for one process" bash -c "! grep -q TOTAL '$tmp/out'"
check "stats: request file removed afterwards" no_stats_files
stats --json "$fake"
check "stats: --json for one process" json_true \
    "doc['processes'][0]['pid'] == $fake and doc['processes'][0]['top'][0]['ctx'] == 1"

# ---------------------------------------------------------------------------
# ipccache-stats: several processes, totals and formats

new_case
start_fake 1 --lib "$lib"; one=$fake
start_fake 2 --lib "$lib" --comm 'we"ird\name'; two=$fake
stats --json "$one" "$two"
check "stats: --json exits 0" rc_is 0
check "stats: --json parses" py -m json.tool "$tmp/out" /dev/null
check "stats: --json lists both processes" json_true \
    "sorted(p['pid'] for p in doc['processes']) == sorted([$one, $two])"
check "stats: --json totals sum the integer keys" json_true \
    "doc['total']['opens'] == 30 and doc['total']['hits'] == 24 and doc['total']['idle_bytes'] == 3 << 30 and doc['total']['future_counter'] == 21"
check "stats: --json totals sum saved_ms, not settings or means" json_true \
    "abs(doc['total']['saved_ms'] - 2.4) < 1e-9 and 'max_idle_bytes' not in doc['total'] and 'open_ns_mean' not in doc['total'] and 'pid' not in doc['total']"
mkdir -p -m 700 "$tmp/empty"
stats --all --dir "$tmp/empty" --json
py -c 'import json,sys; print(" ".join(sorted(json.load(open(sys.argv[1]))["total"])))' "$tmp/out" >"$tmp/none"
stats --json "$one"
check "stats: --json total has one key set, with no process as with one (the fake's own extra aside)" \
    json_true "sorted(k for k in doc['total'] if k != 'future_counter') == open('$tmp/none').read().split() and 'vmm_import_hits' in doc['total']"
stats --wide "$one" "$two"
check "stats: table has a TOTAL row" grep -qE "^ *TOTAL +30 +24 +80\.0 +6 " "$tmp/out"
check "stats: table shows the command name as is" out_has 'we"ird\name'
stats --prometheus "$one" "$two"
check "stats: --prometheus exits 0" rc_is 0
check "stats: --prometheus follows the exposition format" \
    py "$tmp/check_prom.py" 'we"ird\name' <"$tmp/out"
check "stats: --prometheus escapes label values" out_has 'comm="we\"ird\\name"'
check "stats: --prometheus sample values" \
    out_has "ipccache_opens_total{pid=\"$two\",comm=\"we\\\"ird\\\\name\"} 20"
check "stats: --prometheus saved seconds" grep -qE "^ipccache_saved_seconds_total\{pid=\"$one\".*\} 0\.0008$" "$tmp/out"
check "stats: --prometheus exports a newer key as untyped" out_has "# TYPE ipccache_future_counter untyped"
timeout -s INT 2 env IPCCACHE_STATS_LIBNAME=$LIBNAME "$PY" "$STATS_TOOL" --watch 0.4 --json "$one" \
    >"$tmp/out" 2>"$tmp/err"
check "stats: --watch refreshes (one JSON document per line)" py -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
sys.exit(0 if len(lines) >= 2 and all(json.loads(l)["processes"] for l in lines) else 1)' "$tmp/out"

# ---------------------------------------------------------------------------
# ipccache-stats: where the line goes (the marker says)

new_case
printf '{"schema":1,"pid":%d,"opens":999}\n' 1 >"$case/shared.log"
IPCCACHE_STATS_FILE="$case/shared.log" start_fake 3 --lib "$lib"
stats --json "$fake"
check "stats: IPCCACHE_STATS_FILE: reads the new line, not older ones" \
    json_true "doc['processes'][0]['opens'] == 30"
IPCCACHE_STATS_FILE="$case/per-%p.log" start_fake 1 --lib "$lib"
stats --json "$fake"
check "stats: IPCCACHE_STATS_FILE with %p" json_true "doc['processes'][0]['opens'] == 10"
IPCCACHE_STATS_SIGNAL=SIGUSR2 start_fake 1 --lib "$lib"
stats "$fake"
check "stats: uses the target's IPCCACHE_STATS_SIGNAL" rc_is 0
check "stats: ... and the target survives it" alive "$fake"
mkdir -m 700 "$case/req"
IPCCACHE_STATS_DIR="$case/req" start_fake 2 --lib "$lib"
stats --json "$fake"
check "stats: uses the target's IPCCACHE_STATS_DIR" json_true "doc['processes'][0]['opens'] == 20"
check "stats: ... and removes the request file there" \
    bash -c "! ls -A '$case/req' | grep -q ."

# ---------------------------------------------------------------------------
# ipccache-stats: refusals and failures

new_case
start_fake 1 --lib "$lib" --no-handler; nohandler=$fake
stats "$nohandler"
check "stats: handler not installed: exit 1" rc_is 1
check "stats: handler not installed: says so" err_has "no IPC yet"
check "stats: handler not installed: says there is no marker" err_has "no ipccache marker for pid $nohandler"
check "stats: handler not installed: process not signalled (still alive)" alive "$nohandler"

sleep 30 &
plain=$!; fake_pids+=("$plain")
stats "$plain"
check "stats: process without the library: exit 1" rc_is 1
check "stats: process without the library: says so" err_has "$LIBNAME is not loaded"
check "stats: process without the library: still alive" alive "$plain"

IPCCACHE_STATS_SIGNAL=0 start_fake 1 --lib "$lib"
stats "$fake"
check "stats: IPCCACHE_STATS_SIGNAL=0 is refused" err_has "IPCCACHE_STATS_SIGNAL=0"

IPCCACHE_DISABLE=yes start_fake 1 --lib "$lib" --no-handler
stats "$fake"
check "stats: IPCCACHE_DISABLE: refused, not signalled" \
    bash -c "[[ $rc == 1 ]] && grep -q 'disabled in this process' '$tmp/err' && kill -0 $fake"

true & dead=$!
wait "$dead"
stats "$dead"
check "stats: dead PID: exit 1" rc_is 1
check "stats: dead PID: message" grep -q "^ipccache-stats: pid $dead: no such process" "$tmp/err"

start_fake 1 --lib "$lib"; good=$fake
stats abc "$good"
check "stats: non-numeric PID: exit 2 (usage)" rc_is 2
check "stats: non-numeric PID: message" grep -q "^ipccache-stats: 'abc' is not a process id" "$tmp/err"
check "stats: non-numeric PID: the other PIDs still served" grep -qE "^ *$good " "$tmp/out"

start_fake 1 --lib "$lib" --silent
SECONDS=0
stats --timeout 0.3 "$fake"
check "stats: no answer: exit 1" rc_is 1
check "stats: no answer: timeout message" err_has "no answer within 0.3s"
check "stats: no answer: gives up in time" test "$SECONDS" -le 3
check "stats: no answer: request file removed" no_stats_files

start_fake 1 --lib "$lib" --garbage
stats --timeout 0.3 "$fake"
check "stats: malformed line: reported" err_has "malformed stats line"

start_fake 1 --lib "$lib"
: >"$(userdir)/ipccache-$fake.stats"
stats "$fake"
check "stats: existing request file: refused" err_has "already exists"
rm -f "$(userdir)/ipccache-$fake.stats"

# ---------------------------------------------------------------------------
# ipccache-stats: only a process with a live marker is signalled

new_case
start_fake 1 --lib "$lib" --no-marker; own=$fake
stats "$own"
check "stats: program using the signal itself, no marker: refused" err_has "no ipccache marker"
check "stats: ... and not signalled" alive "$own"
start_fake 1 --lib "$lib" --stale-marker; stale=$fake
stats "$stale"
check "stats: marker with another start time (pid reused): refused" err_has "stale"
check "stats: ... and not signalled" alive "$stale"
start_fake 1 --lib "$lib" --exec-marker; execd=$fake
stats "$execd"
check "stats: marker from before an exec (library moved): refused" err_has "predates an exec"
check "stats: ... and not signalled" alive "$execd"
stats --all --dir "$(userdir)"
check "stats: --all skips all three" \
    bash -c "[[ $rc == 0 ]] && ! grep -qE '^ *($own|$stale|$execd) ' '$tmp/out'"
check "stats: --all signals none" bash -c "kill -0 $own && kill -0 $stale && kill -0 $execd"
sleep 30 &
gone=$!; fake_pids+=("$gone")
printf 'ipccache-marker 1\npid=%d\nstart=1\nsignal=10\nbase=1\nstats_file=\nrequest_dir=\n' "$gone" \
    >"$(userdir)/ipccache-$gone.marker"
kill -KILL "$gone"; wait "$gone" 2>/dev/null
stats --all --dir "$(userdir)"
check "stats: --all removes the marker of a process that is gone" \
    test ! -e "$(userdir)/ipccache-$gone.marker"

# ---------------------------------------------------------------------------
# ipccache-stats: nothing the target names can hang, flood or misplace it

new_case
mkfifo "$case/fifo"
IPCCACHE_STATS_FILE=/dev/zero start_fake 1 --lib "$lib"; zero=$fake
SECONDS=0
stats --timeout 5 "$zero"
check "stats: IPCCACHE_STATS_FILE=/dev/zero: refused at once" \
    bash -c "[[ $rc == 1 && $SECONDS -le 3 ]] && grep -q 'not a regular file' '$tmp/err'"
IPCCACHE_STATS_FILE="$case/fifo" start_fake 1 --lib "$lib"
SECONDS=0
stats --timeout 5 "$fake"
check "stats: IPCCACHE_STATS_FILE a FIFO: refused at once" \
    bash -c "[[ $rc == 1 && $SECONDS -le 3 ]] && grep -q 'not a regular file' '$tmp/err'"
IPCCACHE_STATS_FILE="$case/huge.log" start_fake 1 --lib "$lib" --grow
stats --json "$fake"
check "stats: a stats file grown by 16 GiB: only its end is read" \
    json_true "doc['processes'][0]['opens'] == 10"
rm -f "$case/huge.log"
mkdir -m 777 "$case/open"
IPCCACHE_STATS_DIR="$case/open" start_fake 1 --lib "$lib"
stats "$fake"
check "stats: request folder others can write to: refused" err_has "only it can write to"
check "stats: ... and no file created there" bash -c "! ls -A '$case/open' | grep -q ."
ln -s "$case/open" "$case/link"
IPCCACHE_STATS_DIR="$case/link" start_fake 1 --lib "$lib"
stats "$fake"
check "stats: request folder through a symlink: refused" err_has "cannot open directory"

# Another user's process.
new_case
if [[ $(id -u) != 0 ]]; then
    if [[ $(stat -c %u /proc/1) != $(id -u) ]]; then
        stats 1
        check "stats: another user's process (pid 1): refused" err_has "permission denied"
    else
        skip "stats: another user's process" "pid 1 is ours"
    fi
elif ! command -v setpriv >/dev/null ||
    ! setpriv --reuid=65534 --regid=65534 --clear-groups "$PY" -c pass 2>/dev/null; then
    skip "stats: another user's process" "running as root, cannot run Python as uid 65534"
elif ! cp "$STATS_TOOL" "$tmp/ipccache-stats" ||
    ! setpriv --reuid=65534 --regid=65534 --clear-groups "$PY" "$tmp/ipccache-stats" --version \
        >/dev/null 2>&1; then
    skip "stats: another user's process" "uid 65534 cannot read $tmp (TMPDIR in a private folder?)"
else
    # uid 65534 runs a copy: the source tree may be in a folder only we can
    # enter (a clone in a home directory, mktemp -d).
    start_fake 1 --lib "$lib"
    IPCCACHE_STATS_LIBNAME=$LIBNAME timeout "$LIMIT" setpriv --reuid=65534 --regid=65534 \
        --clear-groups "$PY" "$tmp/ipccache-stats" "$fake" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    check "stats: another user's process: exit 1" rc_is 1
    check "stats: another user's process: permission denied" err_has "permission denied"
    check "stats: another user's process: still alive" alive "$fake"
    # start_other ENV...: a fake run by uid 65534, with its own per-user
    # folder; pid in $fake.
    mkdir -m 700 "$case/xdg65534"
    chown 65534:65534 "$case/xdg65534"
    start_other() {
        local ready="$tmp/run/ready.$((++fake_seq))"
        env XDG_RUNTIME_DIR="$case/xdg65534" LIBNAME=$LIBNAME "$@" setpriv --reuid=65534 --regid=65534 \
            --clear-groups "$PY" "$tmp/fake_target.py" "$ready" 4 --lib "$lib" 2>>"$tmp/fake.err" &
        fake=$!; fake_pids+=("$fake")
        wait_for_file "$ready"
    }
    # Root asking a process of another user: the request file is created in
    # that user's folder and given to that user.
    start_other
    stats --json "$fake"
    check "stats: root asking another user's process" json_true "doc['processes'][0]['opens'] == 40"
    check "stats: ... its request file removed" \
        bash -c "! compgen -G '$case/xdg65534/ipccache/*.stats' >/dev/null"
    # That user names a folder of root's (IPCCACHE_STATS_DIR=/etc, say):
    # root must not create a file there.
    mkdir -m 755 "$case/rootdir"
    start_other IPCCACHE_STATS_DIR="$case/rootdir"
    stats "$fake"
    check "stats: root refuses a request folder not of the target's user" \
        err_has "not a directory of uid 65534"
    check "stats: ... and creates nothing there" bash -c "! ls -A '$case/rootdir' | grep -q ."
    # ... or a file of root's as its stats file: not read.
    echo secret >"$case/rootfile"
    start_other IPCCACHE_STATS_FILE="$case/rootfile"
    stats "$fake"
    check "stats: root refuses a stats file not of the target's user" \
        err_has "not a regular file of uid 65534"
fi

# ---------------------------------------------------------------------------
# ipccache-stats: --all lists the markers

new_case
start_fake 1 --lib "$lib"; a1=$fake
start_fake 2 --lib "$lib"; a2=$fake
start_fake 5 --lib "$lib" --no-handler; a3=$fake
IPCCACHE_STATS_SIGNAL=0 start_fake 6 --lib "$lib"; a4=$fake
start_fake 7 --no-handler  # not ipccache: not listed
stats --all --dir "$(userdir)" --json
check "stats: --all exits 0" rc_is 0
check "stats: --all finds the processes with a marker" json_true \
    "sorted(p['pid'] for p in doc['processes']) == sorted([$a1, $a2])"
stats --all --dir "$(userdir)"
check "stats: --all: processes without a marker are not listed" \
    bash -c "! grep -qE '^ *($a3|$a4) ' '$tmp/out'"
check "stats: --all: ... nor signalled" bash -c "kill -0 $a3 && kill -0 $a4"
check "stats: --all table has a TOTAL row" grep -qE "^ *TOTAL +30 " "$tmp/out"
stats --all --json
check "stats: --all without --dir: your per-user folder" json_true \
    "{$a1, $a2} <= {p['pid'] for p in doc['processes']}"
stats --dir /tmp 123
check "stats: --dir without --all is a usage error" rc_is 2
new_case
mkdir -m 700 "$(userdir)"
stats --all --dir "$(userdir)" --prometheus
check "stats: --all with no process: exit 0, empty exposition" \
    bash -c "[[ $rc == 0 && ! -s '$tmp/out' ]]"
stats --all --dir "$(userdir)"
check "stats: --all with no process: says when a process appears" eval 'rc_is 0 &&
    out_has "no process with an ipccache marker found (a process appears after its first CUDA IPC call)"'
stats --help
check "stats: --help explains the ledger file left in the per-user folder" eval 'rc_is 0 &&
    tr -s " \n" "  " <"$tmp/out" | grep -qF "release-ledger-v5"'
stop_fakes

# ---------------------------------------------------------------------------
# ipccache-run

run_tool --help
check "run: --help exits 0" rc_is 0
check "run: --help shows usage" out_has "Usage: ipccache-run"
run_tool --version
check "run: --version" out_has "ipccache-run "
for bad in 12X -5 "" 1.5G 16777216T; do
    run_tool --lib /nonexistent --max-idle-bytes "$bad" true
    check "run: --max-idle-bytes '$bad' exits 2" rc_is 2
done
check "run: error messages start with 'ipccache-run: '" grep -q '^ipccache-run: ' "$tmp/err"
for bad in "--max-idle-entries abc" "--log verbose" "--stats-signal KILL" \
    "--stats-signal TERM" "--stats-file a%x" "--bogus" "--log"; do
    # shellcheck disable=SC2086 # split into option and value on purpose
    run_tool --lib /nonexistent $bad true
    check "run: $bad exits 2" rc_is 2
done
run_tool --lib /nonexistent
check "run: no command exits 2" rc_is 2
run_tool --lib "$tmp/nonexistent.so" true
check "run: --lib missing exits 127" rc_is 127
IPCCACHE_LIB="$tmp/nonexistent.so" run_tool true
check "run: IPCCACHE_LIB missing exits 127" rc_is 127
check "run: IPCCACHE_LIB missing: message" err_has "ipccache-run: IPCCACHE_LIB=$tmp/nonexistent.so: no such file"
# Not a library: ld.so would only say so and run the command without the
# cache; both ways of naming it stop here, with the same words.
printf 'not a library\n' >"$tmp/text.so"
run_tool --lib "$tmp/text.so" true
check "run: --lib naming a file that is not a library exits 127" \
    eval 'rc_is 127 && [[ $(cat "$tmp/err") == "ipccache-run: --lib $tmp/text.so: not a shared library (no ELF header)" ]]'
IPCCACHE_LIB="$tmp/text.so" run_tool true
check "run: IPCCACHE_LIB naming a file that is not a library exits 127, the same words" \
    eval 'rc_is 127 && [[ $(cat "$tmp/err") == "ipccache-run: IPCCACHE_LIB=$tmp/text.so: not a shared library (no ELF header)" ]]'
run_tool --lib "$tmp" true
check "run: --lib naming a folder exits 127" \
    eval 'rc_is 127 && grep -qF "ipccache-run: --lib $tmp: not a shared library" "$tmp/err"'
mkdir -p "$tmp/bare/bin"
cp "$RUN_TOOL" "$tmp/bare/bin/"
timeout "$LIMIT" env -u IPCCACHE_LIB "$tmp/bare/bin/ipccache-run" true >"$tmp/out" 2>"$tmp/err"
rc=$?
check "run: library not found exits 127" rc_is 127
check "run: library not found: message" err_has "cannot find libipccache.so"

# A real shared object to preload: ld.so refuses anything else.
so="$root/build/tests/libcuda.so.1"
if [[ -f $so ]]; then
    so="$(cd "$(dirname "$so")" && pwd -P)/$(basename "$so")"
else
    so="$tmp/libdummy.so"
    echo 'int ipccache_tools_test_dummy;' >"$tmp/dummy.c"
    "${CC:-cc}" -shared -fPIC -o "$so" "$tmp/dummy.c" 2>/dev/null || so=
fi
if [[ -n $so ]]; then
    cp "$so" "$tmp/libother.so"
    other="$tmp/libother.so"
    run_tool --lib "$so" --disable --max-idle-bytes 4G --max-idle-entries 7 --log debug \
        --stats-file "$tmp/s-%p.log" --stats-signal USR2 --stats-at-exit --strict \
        --stats-dir "$tmp/req" -- env
    check "run: runs the command" rc_is 0
    for want in IPCCACHE_DISABLE=1 IPCCACHE_MAX_IDLE_BYTES=4G IPCCACHE_MAX_IDLE_ENTRIES=7 \
        IPCCACHE_LOG=debug "IPCCACHE_STATS_FILE=$tmp/s-%p.log" IPCCACHE_STATS_SIGNAL=USR2 \
        IPCCACHE_STATS_AT_EXIT=1 IPCCACHE_STRICT=1 "IPCCACHE_STATS_DIR=$tmp/req" \
        "LD_PRELOAD=$so"; do
        check "run: sets $want" grep -qxF -- "$want" "$tmp/out"
    done
    LD_PRELOAD=$other run_tool --lib "$so" env
    check "run: appends to LD_PRELOAD (colons)" grep -qxF "LD_PRELOAD=$other:$so" "$tmp/out"
    LD_PRELOAD="$other $other" run_tool --lib "$so" env
    check "run: appends to LD_PRELOAD (spaces)" grep -qxF "LD_PRELOAD=$other $other $so" "$tmp/out"
    LD_PRELOAD="$so:$other" run_tool --lib "$so" env
    check "run: does not add the library twice" grep -qxF "LD_PRELOAD=$so:$other" "$tmp/out"
    IPCCACHE_LIB=$so run_tool env
    check "run: IPCCACHE_LIB" grep -qxF "LD_PRELOAD=$so" "$tmp/out"
    mkdir -p "$tmp/prefix/bin" "$tmp/prefix/lib"
    cp "$RUN_TOOL" "$tmp/prefix/bin/"
    cp "$so" "$tmp/prefix/lib/libipccache.so"
    timeout "$LIMIT" env -u IPCCACHE_LIB "$tmp/prefix/bin/ipccache-run" env >"$tmp/out" 2>"$tmp/err"
    check "run: finds PREFIX/lib/libipccache.so" \
        grep -qxF "LD_PRELOAD=$(cd "$tmp/prefix/lib" && pwd -P)/libipccache.so" "$tmp/out"
    run_tool --lib "$so" sh -c 'exit 7'
    check "run: exit status is the command's" rc_is 7
    run_tool --lib "$so" no-such-command-ipccache
    check "run: unknown command exits 127" rc_is 127
else
    skip "run: preloading" "no shared object to preload (no stand-in driver, no compiler)"
fi

# ---- end to end: the real library, the stand-in driver, both tools --------

# wait_ready FILE: until the probe has printed "ready" (5 s at most).
wait_ready() {
    local i
    for i in $(seq 50); do
        grep -qx ready "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

build=${IPCC_TEST_BUILD:-$root/build}
probe=$build/tests/probe
lib=$build/libipccache.so
if [[ -x $probe && -f $lib ]]; then
    # A sanitizer build of the library needs its runtime preloaded first.
    prefix=${IPCC_TEST_PRELOAD_PREFIX:-}
    new_case
    # Started through ipccache-run, as an operator would; 99 opens, 98 hits.
    LD_PRELOAD=$prefix LD_LIBRARY_PATH=$build/tests \
        "$RUN_TOOL" --lib "$lib" "$probe" hold 99 20 >"$tmp/probe.out" 2>&1 &
    real_pid=$!
    fake_pids+=("$real_pid")
    if wait_ready "$tmp/probe.out"; then
        timeout "$LIMIT" "$PY" "$STATS_TOOL" --json "$real_pid" >"$tmp/out" 2>"$tmp/err"
        rc=$?
        check "e2e: stats of a real cached process" rc_is 0
        check "e2e: its hits and real opens" "$PY" -c '
import json, sys
p = json.load(open(sys.argv[1]))["processes"][0]
sys.exit(0 if (p["opens"], p["hits"], p["real_opens"]) == (99, 98, 1) else 1)' "$tmp/out"
        timeout "$LIMIT" "$PY" "$STATS_TOOL" --prometheus "$real_pid" >"$tmp/out" 2>"$tmp/err"
        check "e2e: prometheus hits counter" grep -q "^ipccache_hits_total{.*} 98\$" "$tmp/out"
        check "e2e: the process lives on" kill -0 "$real_pid"
        check "e2e: it left its marker in the per-user folder" \
            test -f "$(userdir)/ipccache-$real_pid.marker"
        timeout "$LIMIT" "$PY" "$STATS_TOOL" --all --dir "$(userdir)" --json >"$tmp/out" 2>"$tmp/err"
        rc=$?
        check "e2e: --all finds it by its marker" json_true \
            "[p['pid'] for p in doc['processes']] == [$real_pid] and doc['processes'][0]['hits'] == 98"
        check "e2e: no request file left" no_stats_files
    else
        not_ok "e2e: probe under ipccache-run did not start"
        sed 's/^/#   /' "$tmp/probe.out"
    fi
    stop_fakes

    # The library is loaded but no IPC happened: no handler, so no signal.
    LD_LIBRARY_PATH=$build/tests LD_PRELOAD="${prefix:+$prefix:}$lib" "$probe" hold 0 20 \
        >"$tmp/probe0.out" 2>&1 &
    idle_pid=$!
    fake_pids+=("$idle_pid")
    if wait_ready "$tmp/probe0.out"; then
        timeout "$LIMIT" "$PY" "$STATS_TOOL" "$idle_pid" >"$tmp/out" 2>"$tmp/err"
        rc=$?
        check "e2e: no IPC yet is refused" rc_is 1
        check "e2e: ... because it has no marker" err_has "no ipccache marker for pid $idle_pid"
        check "e2e: and that process was not signalled" kill -0 "$idle_pid"
    else
        not_ok "e2e: idle probe did not start"
    fi
    stop_fakes
else
    skip "e2e: real library" "build/tests/probe or build/libipccache.so not built"
fi

new_case  # reaps the last processes
tap_summary tools
