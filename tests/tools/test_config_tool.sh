#!/usr/bin/env bash
#
# test_config_tool.sh - ipccache-config (the library's settings parser as a
# command) and ipccache-run's use of it: the variables already in the
# environment are checked like options, with the library's own grammar.
# Needs build/ipccache-config (make test-sanitize builds it too).

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup config
config=$root/build/ipccache-config
run_tool=$root/tools/ipccache-run
TAP_SHOW="$tmp/out $tmp/err"

# Runs "$@" with output in $tmp/out, $tmp/err and the status in $rc.
rc=0
capture() { "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }
rc_is() { [[ $rc == "$1" ]]; }
err_is() { [[ $(cat "$tmp/err") == "$1" ]]; }

if [[ ! -x $config ]]; then
    not_ok "ipccache-config is built ($config)"
    tap_summary config
    exit
fi

good_line="ipccache-config: every IPCCACHE_* setting is good"
capture "$config" --check
check "config: an empty environment is fine, and --check says so (0)" \
    eval 'rc_is 0 && err_is "" && [[ $(cat "$tmp/out") == "$good_line" ]]'
capture env IPCCACHE_MAX_IDLE_BYTES=banana "$config" --check
check "config: a bad value is an error saying what the library would do, exit 1" eval 'rc_is 1 && err_is \
"ipccache: error: IPCCACHE_MAX_IDLE_BYTES=\"banana\" is invalid: expected a size such as 8G, 512M or 1048576; the library would use the default (8G)"'
check "config: ... and no success line" test ! -s "$tmp/out"
capture env IPCCACHE_MAX_IDLE_BYTES=16X "$config" --check
check "config: --check exits 1 on a bad size without IPCCACHE_STRICT" rc_is 1
capture env IPCCACHE_MAX_IDLE_BYTES=16GB "$config" --check
check "config: 16GB is refused on purpose, and 16G suggested" eval 'rc_is 1 && err_is \
"ipccache: error: IPCCACHE_MAX_IDLE_BYTES=\"16GB\" is invalid: GB is refused on purpose, 10^9 bytes to some and 2^30 to others (did you mean 16G, 16 GiB?); the library would use the default (8G)"'
capture env IPCCACHE_MAX_IDLE_BYTES=512mb "$config" --check
check "config: 512mb: did you mean 512m" grep -qF "mb is refused on purpose, 10^6 bytes to some and 2^20 to others (did you mean 512m, 512 MiB?)" "$tmp/err"
capture env IPCCACHE_MAX_IDLE_BYTES=16g "$config" --check
check "config: 16g is taken (either case)" eval 'rc_is 0 && err_is ""'
capture env IPCCACHE_DISABLE=2 "$config" --check
check "config: IPCCACHE_DISABLE=2 says which values turn the cache off" eval 'rc_is 1 && err_is \
"ipccache: error: IPCCACHE_DISABLE=\"2\" is invalid: expected 1, true, yes or on to turn the cache off (0, false, no or off leave it on); the library would use the default (0)"'
capture env IPCCACHE_LOG=error IPCCACHE_RELEASE_WAIT_MS=-1 "$config" --check
check "config: --check says a bad value even when IPCCACHE_LOG hides warnings" eval 'rc_is 1 && \
grep -q "^ipccache: error: IPCCACHE_RELEASE_WAIT_MS=\"-1\" is invalid" "$tmp/err"'
capture env IPCCACHE_STRICT=maybe "$config" --check
check "config: --check exits 1 on a bad IPCCACHE_STRICT" rc_is 1
capture env IPCCACHE_MAX_IDLE_BYTE=1G "$config" --check
check "config: a misspelled variable is one error naming the setting, exit 1" eval 'rc_is 1 && err_is \
"ipccache: error: IPCCACHE_MAX_IDLE_BYTE is not a setting (did you mean IPCCACHE_MAX_IDLE_BYTES?); the library would ignore it"'
capture env IPCCACHE_STATS_FILE=/nonexistent/dir/x.json "$config" --check
check "config: a stats file that cannot be written is an error, exit 1" eval 'rc_is 1 && err_is \
"ipccache: error: IPCCACHE_STATS_FILE=\"/nonexistent/dir/x.json\" cannot be written (/nonexistent/dir: No such file or directory); the library would write the stats lines to stderr"'
mkdir -m 755 "$tmp/statsdir"
capture env IPCCACHE_STATS_FILE="$tmp/statsdir/s.%p.json" "$config" --check
check "config: a stats file that can be created passes, and is not created" \
    eval 'rc_is 0 && err_is "" && [[ -z $(ls -A "$tmp/statsdir") ]]'
ln -s /dev/null "$tmp/statsdir/link"
capture env IPCCACHE_STATS_FILE="$tmp/statsdir/link" "$config" --check
check "config: a stats file that is a symlink is an error (the library never follows one)" eval 'rc_is 1 && \
grep -qF "cannot be written (not a regular file of this user)" "$tmp/err"'
capture env IPCCACHE_MAX_IDLE_BYTES=16G IPCCACHE_VMM=0 IPCCACHE_LOG=info "$config" --check
check "config: good values pass --check (0)" eval 'rc_is 0 && err_is "" && [[ $(cat "$tmp/out") == "$good_line" ]]'
capture env IPCCACHE_LIB=/x IPCCACHE_STATS_LIBNAME=y "$config" --check
check "config: the tools' own variables are not misspellings" eval 'rc_is 0 && err_is ""'
capture env IPCCACHE_STRICT=1 IPCCACHE_LOG=bogus "$config" --check
check "config: strict: exit 78 with the library's error" eval 'rc_is 78 && err_is \
"ipccache: error: IPCCACHE_LOG=\"bogus\" is invalid: expected one of error, warn, info, debug (IPCCACHE_STRICT is on)"'
capture "$config" --version
check "config: --version prints the version (0)" eval 'rc_is 0 && [[ $(cat "$tmp/out") == "ipccache-config 0.1.0" ]]'
capture "$config" --check-value IPCCACHE_STATS_SIGNAL RTMIN+2
check "config: --check-value accepts a good value" rc_is 0
capture "$config" --check-value IPCCACHE_STATS_SIGNAL TERM
check "config: --check-value refuses a bad one (1)" rc_is 1
capture "$config" --check-value IPCCACHE_NOPE 1
check "config: --check-value: unknown name (2)" rc_is 2
capture "$config" --list
check "config: --list names every setting once" \
    eval '[[ $(cut -f1 "$tmp/out" | sort -u | grep -c "^IPCCACHE_") == $(wc -l <"$tmp/out") ]]'
capture "$config" --bogus
check "config: an unknown option is named, exit 2" eval 'rc_is 2 && \
[[ $(head -n 1 "$tmp/err") == "ipccache-config: unknown option '"'"'--bogus'"'"'" ]]'
capture "$config" --check extra
check "config: a known option with a wrong argument count is a usage error, exit 2" eval 'rc_is 2 && \
grep -q "^ipccache-config: --check takes no argument" "$tmp/err"'
capture "$config"
check "config: no option at all: the usage, exit 2" eval 'rc_is 2 && grep -q "^Usage: ipccache-config" "$tmp/err"'

# ipccache-run: a harmless library to preload.
so=$root/build/tests/libcuda.so.1

# One ipccache-run option for each setting of config.c's table: --help names
# each variable in brackets once, and no other; each option, run, sets it
# ([NAME=V]: a flag; else the table's default, or a path for those unset).
"$run_tool" --help | awk '/^  --/ { if (o) print o; o = $0; next } /^   / { o = o " " $0 }
    END { print o }' >"$tmp/help"
grep -oE '\[IPCCACHE_[A-Z_]+' "$tmp/help" | tr -d '[' | sort >"$tmp/help_names"
"$config" --list | cut -f1 | sort >"$tmp/table_names"
check "run: one option for each setting of ipccache-config --list, and no other" \
    cmp -s "$tmp/help_names" "$tmp/table_names"
unset_value() { case $1 in IPCCACHE_STATS_FILE) echo "$tmp/stats.%p" ;; *) echo "$tmp" ;; esac; }
if [[ -f $so ]]; then
    # OPTION|NAME|FLAG VALUE ('|': tabs would merge an empty field)
    sed -nE 's/^  (--[a-z-]+).*\[(IPCCACHE_[A-Z_]+)(=([^]]+))?\].*/\1|\2|\4/p' "$tmp/help" >"$tmp/options"
    while IFS='|' read -r opt var flag; do
        value=$flag args=("$opt")
        if [[ -z $flag ]]; then
            value=$("$config" --list | awk -F'\t' -v n="$var" '$1 == n { print $2 }')
            [[ $value == unset ]] && value=$(unset_value "$var")
            args=("$opt" "$value")
        fi
        capture env -u "$var" "$run_tool" --lib "$so" "${args[@]}" env
        # (not $name: check's own local)
        check "run: ${args[*]} sets $var=$value" eval 'rc_is 0 && grep -qxF "$var=$value" "$tmp/out"'
    done <"$tmp/options"
fi

if [[ -f $so ]]; then
    capture env IPCCACHE_MAX_IDLE_BYTES=banana "$run_tool" --lib "$so" --strict /bin/true
    check "run: --strict: a bad inherited variable exits 78" eval 'rc_is 78 && grep -q \
"^ipccache: error: IPCCACHE_MAX_IDLE_BYTES=\"banana\" is invalid" "$tmp/err"'
    capture env IPCCACHE_STRICT=yes IPCCACHE_STATS_DIR=relative "$run_tool" --lib "$so" /bin/true
    check "run: IPCCACHE_STRICT in the environment counts too" rc_is 78
    capture env IPCCACHE_MAX_IDLE_BYTES=banana "$run_tool" --lib "$so" /bin/echo hi
    check "run: without strict, a bad inherited value is left to the library (said once, there)" \
        eval 'rc_is 0 && [[ $(cat "$tmp/out") == hi ]] && err_is ""'
    capture env IPCCACHE_MAX_IDLE_BYTE=1G "$run_tool" --lib "$so" --strict /bin/true
    check "run: --strict: a misspelled inherited variable exits 78" eval 'rc_is 78 && grep -q \
"^ipccache: error: IPCCACHE_MAX_IDLE_BYTE is not a setting" "$tmp/err"'
    capture "$run_tool" --lib "$so" --max-idle-bytes 12X /bin/true
    check "run: a bad option names the option and the expected form" eval 'rc_is 2 && grep -q \
"^ipccache-run: --max-idle-bytes: IPCCACHE_MAX_IDLE_BYTES=\"12X\" is invalid: expected a size" "$tmp/err"'
    capture "$run_tool" --lib "$so" --max-idle-bytes 16GB /bin/true
    check "run: --max-idle-bytes 16GB: did you mean 16G" eval 'rc_is 2 && grep -qF \
"ipccache-run: --max-idle-bytes: IPCCACHE_MAX_IDLE_BYTES=\"16GB\" is invalid: GB is refused on purpose" "$tmp/err" &&
grep -qF "(did you mean 16G, 16 GiB?)" "$tmp/err"'
else
    skip "run: checks through ipccache-config" "no stand-in driver to preload ($so)"
fi

# With the library itself and a program that opens a handle: the one message.
lib=$root/build/libipccache.so probe=$root/build/tests/probe
if [[ -f $lib && -x $probe ]]; then
    capture env LD_LIBRARY_PATH="$root/build/tests" IPCCACHE_MAX_IDLE_BYTES=banana \
        "$run_tool" --lib "$lib" "$probe" openclose 3
    check "run: a bad inherited value is said once, naming the default" eval 'rc_is 0 && \
[[ $(wc -l <"$tmp/err") == 1 ]] && grep -q "using the default (8G)$" "$tmp/err"'
    capture env LD_LIBRARY_PATH="$root/build/tests" IPCCACHE_MAX_IDLE_BYTES=16GB \
        "$run_tool" --lib "$lib" "$probe" openclose 3
    check "run: the library's warning for 16GB: refused on purpose, did you mean 16G" eval 'rc_is 0 && \
[[ $(wc -l <"$tmp/err") == 1 ]] && grep -qF "GB is refused on purpose" "$tmp/err" &&
grep -qF "(did you mean 16G, 16 GiB?); using the default (8G)" "$tmp/err"'
    capture env LD_LIBRARY_PATH="$root/build/tests" IPCCACHE_DISABLE=2 "$run_tool" --lib "$lib" "$probe" openclose 3
    check "run: the library's warning for IPCCACHE_DISABLE=2 names the values that turn it off" \
        eval 'rc_is 0 && [[ $(wc -l <"$tmp/err") == 1 ]] && grep -qF \
"IPCCACHE_DISABLE=\"2\" is invalid: expected 1, true, yes or on to turn the cache off" "$tmp/err"'
    capture env LD_LIBRARY_PATH="$root/build/tests" IPCCACHE_STATS_FILE=/nonexistent/dir/x.json \
        IPCCACHE_STATS_AT_EXIT=1 "$run_tool" --lib "$lib" "$probe" openclose 3
    check "run: the library warns once of a stats file it cannot write, then writes to stderr" \
        eval 'rc_is 0 && [[ $(grep -c "^ipccache:" "$tmp/err") == 1 ]] && grep -qxF \
"ipccache: warning: IPCCACHE_STATS_FILE=\"/nonexistent/dir/x.json\" cannot be written (/nonexistent/dir: No such file or directory); the stats lines go to stderr" "$tmp/err" &&
grep -q "^{\"schema\":1," "$tmp/err"'
    capture env LD_LIBRARY_PATH="$root/build/tests" IPCCACHE_STATS_FILE="$tmp/statsdir/ok.json" \
        IPCCACHE_STATS_AT_EXIT=1 "$run_tool" --lib "$lib" "$probe" openclose 3
    check "run: a stats file it can write: no warning, the line there" \
        eval 'rc_is 0 && err_is "" && grep -q "^{\"schema\":1," "$tmp/statsdir/ok.json"'
else
    skip "run: the library's one warning" "$lib or $probe is not built"
fi

tap_summary config
