#!/usr/bin/env bash
#
# check_exports.sh LIB MAP [WRAPPERS] - the library must export exactly the
# global names of its version script, and every function WRAPPERS (the
# hooks' C file) defines as IPCC_EXPORT must be one of them (a wrapper with
# no row in hooks.def is never exported). A preloaded library is searched before every other
# one, so any extra exported name could hijack another library's function of
# that name; a missing one is a hook that silently never runs.
#
# Prints each difference and exits 1 on a mismatch, 2 on bad usage.

set -u

if [[ $# -lt 2 || $# -gt 3 || ! -f $1 || ! -f $2 || ( $# -eq 3 && ! -f ${3:-} ) ]]; then
    echo "usage: check_exports.sh LIB MAP [WRAPPERS] (each must exist)" >&2
    exit 2
fi
lib=$1 map=$2 wrappers=${3:-}

# Defined dynamic symbols of LIB as "TYPE NAME", version suffixes dropped.
# Version-node symbols (type A) are not functions or data anyone can call.
defined() {
    nm -D --defined-only "$lib" | awk 'NF >= 3 && $2 != "A" { sub(/@.*/, "", $3); print $2, $3 }'
}

# The names listed under "global:" in MAP, one per line; comments dropped.
map_globals() {
    awk '
        # Strip /* ... */ comments, which may span lines.
        {
            line = $0; out = ""
            while (line != "") {
                if (in_comment) {
                    i = index(line, "*/")
                    if (!i) { line = ""; break }
                    line = substr(line, i + 2); in_comment = 0
                } else {
                    i = index(line, "/*")
                    if (!i) { out = out line; line = ""; break }
                    out = out substr(line, 1, i - 1); line = substr(line, i + 2); in_comment = 1
                }
            }
            sub(/(#|\/\/).*/, "", out)
            gsub(/:/, ": ", out)
            n = split(out, tok, /[ \t;{}]+/)
            for (k = 1; k <= n; k++) {
                if (tok[k] == "global:") in_global = 1
                else if (tok[k] == "local:") in_global = 0
                else if (tok[k] != "" && in_global) print tok[k]
            }
            if (out ~ /}/) in_global = 0
        }' "$map"
}

symbols=$(defined) || { echo "check_exports: nm failed on $lib" >&2; exit 1; }
text=$(awk '$1 ~ /^[TWi]$/ { print $2 }' <<<"$symbols" | sort -u)
other=$(awk '$1 !~ /^[TWi]$/ { print $2 " (type " $1 ")" }' <<<"$symbols")
wanted=$(map_globals | sort -u)

extra=$(comm -23 <(printf '%s\n' "$text") <(printf '%s\n' "$wanted") | sed '/^$/d')
missing=$(comm -13 <(printf '%s\n' "$text") <(printf '%s\n' "$wanted") | sed '/^$/d')

bad=0
while read -r name; do
    [[ -n $name ]] || continue
    echo "check_exports: $lib exports $name, which $map does not list"
    bad=1
done <<<"$extra"
while read -r name; do
    [[ -n $name ]] || continue
    echo "check_exports: $map lists $name, which $lib does not export"
    bad=1
done <<<"$missing"
while read -r name; do
    [[ -n $name ]] || continue
    echo "check_exports: $lib exports a non-function symbol: $name"
    bad=1
done <<<"$other"
# The wrappers defined (a declaration ends at its ";" before any "{").
if [[ -n $wrappers ]]; then
    defs=$(tr '\n' ' ' <"$wrappers" | grep -o 'IPCC_EXPORT [^;{]*{' |
        sed -E 's/\(.*//; s/.*[ *]//' | sort -u)
    while read -r name; do
        [[ -n $name ]] || continue
        echo "check_exports: $wrappers defines the wrapper $name, which $map does not list"
        bad=1
    done < <(comm -23 <(printf '%s\n' "$defs") <(printf '%s\n' "$wanted") | sed '/^$/d')
fi

if [[ $bad -eq 0 ]]; then
    echo "check_exports: ok, $lib exports exactly the $(wc -l <<<"$wanted") names of $map"
fi
exit $bad
