#!/usr/bin/env bash
# Reproduces the rare request that misses only a reader's switch-in, and asks an independent
# observer why (docs/coverage-audit.md, "Scheduler: switches from tasks BPF does not see").
# Runs RUNS times: one `nice -n 19` busy loop per CPU, a bpftrace observer printing every
# sched_switch and sched_waking, and `meshlab demo --topology all --qps 100 --duration 3s
# --trace-sample 1/1`. Then counts the merged requests, the incomplete ones, and classifies
# each that misses only `<node>:sched_switch` with xtask/missing_switch_in.py.
#
#   sudo xtask/missing-switch-in.sh MESHLAB [RUNS] [OUT_DIR]
#
# Traffic: the demo's own (loopback and the network namespaces it creates). Clean-up: the
# busy loops and bpftrace are killed on exit, also on failure or a signal; the demo removes
# its namespaces itself. OUT_DIR (default a new temporary directory) keeps every run.
set -euo pipefail
meshlab=$(realpath "$1"); runs=${2:-5}
out=${3:-$(mktemp -d /tmp/missing-switch-in.XXXXXX)}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
for _ in $(seq "$(nproc)"); do nice -n 19 bash -c 'while :; do :; done' & pids+=($!); done
observer='tracepoint:sched:sched_switch { printf("S %llu %d %d %d %lld\n", nsecs, cpu, args->prev_pid, args->next_pid, args->prev_state); }
tracepoint:sched:sched_waking { printf("W %llu %d %d %d\n", nsecs, cpu, args->pid, args->target_cpu); }'
total=0; incomplete=0
for r in $(seq "$runs"); do
    log="$out/observer-$r.log"
    bpftrace -e "$observer" >"$log" 2>"$out/observer-$r.err" & bt=$!; pids+=("$bt")
    for _ in $(seq 100); do grep -q Attaching "$log" 2>/dev/null && break; sleep 0.1; done
    grep -q Attaching "$log" || { echo "bpftrace did not start (see $out/observer-$r.err)" >&2; exit 1; }
    "$meshlab" demo --topology all --qps 100 --duration 3s --trace-sample 1/1 \
        --out "$out/run-$r" >"$out/run-$r.log" 2>&1 || { echo "demo run $r failed: $out/run-$r.log" >&2; exit 1; }
    sleep 0.5; kill -INT "$bt"; wait "$bt" || true
    for merged in "$out/run-$r"/*/merged.ndjson; do
        dir=$(dirname "$merged")
        n=$(grep -c '"type":"request"' "$merged" || true)
        bad=$(grep -c '"complete":false' "$merged" || true)
        total=$((total + n)); incomplete=$((incomplete + bad))
        echo "run $r $(basename "$dir"): $n requests, $bad incomplete"
        if [ "$bad" -gt 0 ]; then python3 "$here/missing_switch_in.py" "$meshlab" "$dir" "$log"; fi
    done
done
echo "total: $total requests, $incomplete incomplete, in $runs run(s) of every topology; runs kept in $out"
