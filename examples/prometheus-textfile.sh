#!/bin/sh
# prometheus-textfile.sh DIR [SECONDS] - writes the numbers of every process
# that has ipccache loaded to DIR/ipccache.prom, for node_exporter's textfile
# collector (--collector.textfile.directory=DIR); once, or every SECONDS.
#
# The file is written aside and renamed, so the collector never reads half
# of it. A process that has not used IPC yet is left out (ipccache-stats
# then exits 1 but still prints the others).
set -u
dir=${1:?usage: prometheus-textfile.sh DIR [SECONDS]}
every=${2:-0}
while :; do
    tmp="$dir/.ipccache.prom.$$"
    ipccache-stats --all --prometheus >"$tmp" 2>/dev/null
    if [ -s "$tmp" ]; then mv -f "$tmp" "$dir/ipccache.prom"; else rm -f "$tmp"; fi
    [ "$every" -gt 0 ] || exit 0
    sleep "$every"
done
