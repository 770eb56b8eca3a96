#!/usr/bin/env bash
# Byte-identity check for merge speed work: runs two meshlab binaries on the same inputs and
# compares their merged NDJSON with cmp. Inputs: every merge and catalog test fixture (plain
# and --timeline), plus any extra directories given (e.g. `merge_bench_input` output dirs of
# several SHAPEs, in both their capture and NDJSON forms, or a recording's directory). Both
# binaries run under the argv[0] `meshlab`, because merge_info records the command line.
#
#   xtask/merge-identity.sh OLD_BIN NEW_BIN [EXTRA_DIR...]
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2"); shift 2
extra=(); for d in "$@"; do extra+=("$(realpath "$d")"); done
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
checked=0
check() { # NAME ARGS...
    local name=$1; shift
    (exec -a meshlab "$old" merge "$@" >"$out/old" 2>/dev/null) || echo "old failed: $name"
    (exec -a meshlab "$new" merge "$@" >"$out/new" 2>/dev/null) || echo "new failed: $name"
    cmp "$out/old" "$out/new" || { echo "DIFFERENT: $name"; exit 1; }
    checked=$((checked + 1))
}
cd "$root/meshlab-user/tests/fixtures"
for d in merge/*/ catalog/; do
    files=$(ls "$d"*.ndjson 2>/dev/null | grep -v expected || true)
    [ -n "$files" ] || continue
    # shellcheck disable=SC2086
    check "$d" $files
    # shellcheck disable=SC2086
    check "$d --timeline" --timeline $files
done
shopt -s nullglob # a kernel-only input has no probe files
for d in "${extra[@]}"; do
    cd "$d"
    # merge_bench_input's names (NAME.kernel.capture, NAME.probe.ndjson) and a recording
    # directory's (the demo's kernel-A.capture and probes-client.ndjson, A.capture).
    kernel_captures=(./*.capture); kernel_ndjson=(./*.kernel.ndjson)
    probes=(./*.probe.ndjson ./probes-*.ndjson)
    captures=(); ndjson=()
    # Each form only with its kernel inputs: probe files alone are not that form's check.
    if [ ${#kernel_captures[@]} -gt 0 ]; then captures=("${kernel_captures[@]}" "${probes[@]}"); fi
    if [ ${#kernel_ndjson[@]} -gt 0 ]; then ndjson=("${kernel_ndjson[@]}" "${probes[@]}"); fi
    if [ ${#captures[@]} -gt 0 ]; then
        check "$d capture" "${captures[@]}"
        check "$d capture --timeline" --timeline "${captures[@]}"
    fi
    if [ ${#ndjson[@]} -gt 0 ]; then check "$d ndjson" "${ndjson[@]}"; fi
done
echo "merge-identity: $checked merges byte-identical"
