#!/usr/bin/env bash
# Interleaved side-by-side timing of several meshlab binaries merging the same input (a
# `merge_bench_input` output dir, binary captures + probe NDJSON), output discarded. Each round
# runs every binary once, the order rotating by round; prints per binary the median CPU
# seconds (user+sys, all threads), events per CPU-second, median wall seconds and peak RSS,
# with the load average before and after.
#
#   xtask/merge-ab.sh ROUNDS EVENTS DIR BIN...
set -euo pipefail
rounds=$1 events=$2 dir=$3; shift 3
bins=("$@"); n=${#bins[@]}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
shopt -s nullglob # a kernel-only capture (a `meshlab record` of its own) has no probe files
files=("$dir"/*.kernel.capture "$dir"/*.probe.ndjson)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < rounds; r++)); do
    for ((k = 0; k < n; k++)); do
        i=$(((r + k) % n))
        /usr/bin/time -f "%U %S %e %M" -o "$out/t" "${bins[$i]}" merge "${files[@]}" >/dev/null 2>&1
        cat "$out/t" >>"$out/$i"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
for ((i = 0; i < n; i++)); do
    cpu=$(awk '{print $1+$2}' "$out/$i" | median)
    wall=$(awk '{print $3}' "$out/$i" | median)
    rss=$(awk '{print $4/1024}' "$out/$i" | median)
    rate=$(awk -v e="$events" -v c="$cpu" 'BEGIN {printf "%.0f", e/c}')
    echo "${bins[$i]}: rounds $rounds, median CPU ${cpu} s, ${rate} events/CPU-s, median wall ${wall} s, peak RSS ${rss} MiB"
done
