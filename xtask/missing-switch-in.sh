#!/usr/bin/env bash
# Reproduces the rare request that misses only a reader's switch-in, and asks an independent
# observer why (docs/coverage-audit.md, "Scheduler: switches the kernel does not report").
# Runs RUNS times: one `nice -n 19` busy loop per CPU, a bpftrace observer printing every
# sched_switch, and `meshlab demo --topology all --qps 100 --duration 3s --trace-sample 1/1`.
# Then counts the merged requests and the incomplete ones, and classifies each that misses
# only `<node>:sched_switch` with xtask/missing_switch_in.py (which also prints the recorders'
# hits, received and dropped events, and says when bpftrace lost events).
#
#   sudo xtask/missing-switch-in.sh MESHLAB [RUNS] [OUT_DIR]
#
# Traffic: the demo's own (loopback and the network namespaces it creates). Clean-up: the busy
# loops and bpftrace are killed on exit, also on failure or a signal, and the busy loops end
# by themselves (timeout) should this script be SIGKILLed; the demo removes its namespaces
# itself. OUT_DIR (default a new temporary directory) keeps every run.
set -euo pipefail
shopt -s nullglob
meshlab=$(realpath "$1"); runs=${2:-5}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "RUNS must be a whole number: $runs" >&2; exit 2; }
out=${3:-$(mktemp -d /tmp/missing-switch-in.XXXXXX)}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
loops=(); observer_pid=
cleanup() {
    for p in "${loops[@]}" $observer_pid; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
# A demo run of every topology takes ~35 s here: the loops outlive no run by much.
for _ in $(seq "$(nproc)"); do
    timeout $((runs * 90 + 60)) nice -n 19 bash -c 'while :; do :; done' & loops+=($!)
done
observer='tracepoint:sched:sched_switch { printf("S %llu %d %d %d %lld\n", nsecs, cpu, args->prev_pid, args->next_pid, args->prev_state); }'
total=0; incomplete=0
for r in $(seq "$runs"); do
    log="$out/observer-$r.log"
    bpftrace -e "$observer" >"$log" 2>"$out/observer-$r.err" & observer_pid=$!
    for _ in $(seq 100); do grep -q Attaching "$log" 2>/dev/null && break; sleep 0.1; done
    grep -q Attaching "$log" || { echo "bpftrace did not start (see $out/observer-$r.err)" >&2; exit 1; }
    "$meshlab" demo --topology all --qps 100 --duration 3s --trace-sample 1/1 \
        --out "$out/run-$r" >"$out/run-$r.log" 2>&1 || { echo "demo run $r failed: $out/run-$r.log" >&2; exit 1; }
    sleep 0.5; kill -INT "$observer_pid"; wait "$observer_pid" || true; observer_pid=
    merged_files=("$out/run-$r"/*/merged.ndjson)
    [ ${#merged_files[@]} -gt 0 ] || { echo "demo run $r wrote no merged.ndjson: $out/run-$r.log" >&2; exit 1; }
    for merged in "${merged_files[@]}"; do
        dir=$(dirname "$merged")
        n=$(grep -c '"type":"request"' "$merged" || true)
        bad=$(grep -c '"complete":false' "$merged" || true)
        total=$((total + n)); incomplete=$((incomplete + bad))
        echo "run $r $(basename "$dir"): $n requests, $bad incomplete"
        if [ "$bad" -gt 0 ]; then python3 "$here/missing_switch_in.py" "$meshlab" "$dir" "$log"; fi
    done
done
echo "total: $total requests, $incomplete incomplete, in $runs run(s) of every topology; runs kept in $out"
