#!/bin/bash
# How often bpftrace misses a single SIGINT (xtask/src/truth_lab.rs SIGINT_REPEAT): N times
# (default 10) per mode, the reference script on lo, one SIGINT 0.5 s after its probes attached,
# 5 s to exit; a miss gets a second SIGINT. Root; sends no traffic.
out=$(mktemp); pid=; trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -f "$out"' EXIT
lost=0; n=${1:-10}
for i in $(seq $n); do
  for stamps in 0 1; do
  BPFTRACE_MAP_KEYS_MAX=65536 bpftrace "$(dirname "$0")/reference.bt" lo $stamps > "$out" 2>/dev/null &
  pid=$!
  for j in $(seq 150); do grep -q "attached: last" "$out" 2>/dev/null && break; sleep 0.2; done
  sleep 0.5
  kill -INT $pid
  for j in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $pid 2>/dev/null; then lost=$((lost+1)); echo "run $i stamps $stamps: SIGINT missed"; kill -INT $pid; wait $pid; fi
  wait $pid 2>/dev/null
  done
done
echo "missed $lost of $((2*n))"
