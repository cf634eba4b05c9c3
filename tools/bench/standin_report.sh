#!/usr/bin/env bash
# tools/bench/standin_report.sh - `make bench-standin`: the RL weight sync's VMM calls
# (standin_rl) and the legacy hit pair (standin_hits) on the stand-in driver, as a short
# labelled report ending in one "bench-standin: result:" line.
#
# The weight sync all at once runs 3 times each way, alternating (a busy machine shows as a
# spread); each other shape once each way; the hit pair once, with the library only (the
# stand-in's own locked open and close without it are no comparison). The steps are enough
# for a stable median; BENCH_STANDIN_STEPS and BENCH_STANDIN_PAIRS make it shorter (the tests).
#
# usage: standin_report.sh BUILD LIB
set -u
build=$1 lib=$2
steps=${BENCH_STANDIN_STEPS:-100}
pairs=${BENCH_STANDIN_PAIRS:-200000}
rl=$build/tools/standin_rl hits=$build/tools/standin_hits

# val KEY LINE: the value printed as KEY=value (201.0 as 201).
val() { grep -o "$1=[0-9.]*" <<<"$2" | head -n 1 | cut -d= -f2 | awk '{ printf "%g", $1 }'; }
# ms MICROSECONDS: in milliseconds, 2 decimals.
ms() { awk -v us="$1" 'BEGIN { printf "%.2f", us / 1000 }'; }
# real LINE: the real driver calls a step, in words.
real() {
    printf '%s imports, %s reserves, %s maps, %s set-access, %s unmaps' "$(val imports "$1")" \
        "$(val reserves "$1")" "$(val maps "$1")" "$(val set_access "$1")" "$(val unmaps "$1")"
}
# middle A B C: the median of three.
middle() { printf '%s\n' "$@" | sort -g | sed -n 2p; }

echo "bench-standin: the stand-in driver plays the GPU; times are this machine's, the stand-in's own cost in them"
without=() with=()
for _ in 1 2 3; do
    all_a=$("$rl" 22 "$steps") && all_b=$(LD_PRELOAD=$lib "$rl" 22 "$steps") || exit 1
    without+=("$(val step_median_us "$all_a")") with+=("$(val step_median_us "$all_b")")
done
echo "bench-standin: weight sync, all at once ($(val rebuilds_per_step "$all_a") rebuilds of" \
    "$(val chunks_per_step "$all_a") chunks a step), $steps steps, 3 runs each way, alternating"
for side in without with; do
    declare -n t=$side
    [[ $side == with ]] && line=$all_b || line=$all_a
    printf '  %-8s step median %s, %s, %s ms; real a step: %s\n' "$side" \
        "$(ms "${t[0]}")" "$(ms "${t[1]}")" "$(ms "${t[2]}")" "$(real "$line")"
done

echo "bench-standin: the other shapes (tools/bench/standin_rl.c), $steps steps each, without / with ipccache"
for shape in one reversed shuffled buckets two; do
    a=$("$rl" 22 "$steps" "$shape") && b=$(LD_PRELOAD=$lib "$rl" 22 "$steps" "$shape") || exit 1
    printf '  %-9s step median %6s / %6s ms; real maps a step %3s / %5s; map hits %s%%\n' "$shape" \
        "$(ms "$(val step_median_us "$a")")" "$(ms "$(val step_median_us "$b")")" \
        "$(val maps "$a")" "$(val maps "$b")" "$(grep -o 'map_hits=[0-9.]*' <<<"$b" | cut -d= -f2)"
done

echo "bench-standin: the legacy hit pair with ipccache, ns a pair per thread, $pairs pairs a thread"
out=$(LD_PRELOAD=$lib "$hits" "$pairs") || exit 1
awk '{ split($2, t, "="); split($4, ns, "="); split($6, o, "=")
       if (!($1 in row)) { order[++n] = $1; row[$1] = sprintf("  %-9s", $1) }
       if ($1 == "same") head = head sprintf(" %7s", t[2])
       row[$1] = row[$1] sprintf(" %7s", ns[2]); opens += o[2] }
     END { print "  threads  " head
           for (i = 1; i <= n; i++) print row[order[i]]
           print "  driver opens while timed: " opens }' <<<"$out"

# The result: the all-at-once step, its middle run's median each way.
w=$(middle "${without[@]}") h=$(middle "${with[@]}")
echo "bench-standin: result: a weight sync step of $(val chunks_per_step "$all_a") chunks:" \
    "$(val maps "$all_a") real maps and $(ms "$w") ms without ipccache, $(val maps "$all_b") and $(ms "$h") ms" \
    "with it ($(awk -v w="$w" -v h="$h" 'BEGIN { printf "%.0f", w / h }')x faster here)"
