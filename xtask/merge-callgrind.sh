#!/usr/bin/env bash
# Instruction counts (valgrind callgrind, all threads) of meshlab binaries merging the same
# input (a `merge_bench_input` output dir: binary captures + probe NDJSON), output discarded:
# a deterministic measure of merge work, unlike CPU time on a shared machine. With
# TOP=N (default 0) also prints each binary's N most expensive functions (self cost). A
# directory without NDJSON (a `meshlab record` capture renamed NAME.kernel.capture) takes its
# event count from EVENTS=N (the recorder's summary line).
#
#   xtask/merge-callgrind.sh DIR BIN...
set -euo pipefail
dir=$1; shift
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
shopt -s nullglob # a kernel-only capture has no probe files
files=("$dir"/*.kernel.capture "$dir"/*.probe.ndjson)
ndjson=("$dir"/*.ndjson)
events=${EVENTS:-0}
if [ ${#ndjson[@]} -gt 0 ]; then
    events=$(cat "${ndjson[@]}" | grep -c '^{"type":"\(kernel\|probe\)"' || true)
fi
for bin in "$@"; do
    valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" merge "${files[@]}" \
        >/dev/null 2>"$out/log"
    total=$(sed -n 's/.*Collected : \([0-9]*\)/\1/p' "$out/log")
    if [ "$events" -gt 0 ]; then
        echo "$bin: $total instructions, $((total / events)) per event ($events events)"
    else # captures only: no NDJSON to count the events in
        echo "$bin: $total instructions (events not counted: no kernel/probe NDJSON in $dir)"
    fi
    if [ "${TOP:-0}" -gt 0 ]; then
        callgrind_annotate "$out/cg" 2>/dev/null | sed -n '/file:function/,$p' | sed -n "3,$((TOP + 2))p"
    fi
done
