#!/usr/bin/env bash
# Completeness and skew invariance of the merge on real recordings (not synthetic fixtures),
# as root: every demo topology (direct, one-hop, two-hop and the same-node control), and a
# kernel-only recording of an unmodified redis-server driven by redis-benchmark across two
# network namespaces this script creates (and deletes on exit). For each recording it prints
# the merge's requests and complete ones, then merges it again with every node's clocks shifted
# (--inject-skew) and counts the requests whose durations, error bounds and completeness are
# identical (skew-compare.py). Extra recording directories (e.g. kept two-guest scenarios:
# MESHLAB_VM_KEEP=1 cargo xtask vm-scenarios) can be given after the output directory.
#
#   sudo xtask/merge-real-checks.sh MESHLAB_BIN OUT_DIR [RECORDING_DIR...]
set -euo pipefail
m=$(realpath "$1"); out=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"; out=$(realpath "$out")
skew=A=-1299999877ns,B=2400000246ns

check() { # NAME FILES...
    local name=$1; shift
    "$m" merge "$@" -o "$out/$name.merged.ndjson" 2>&1 | grep -o 'merged .* requests: [0-9]* complete' \
        | sed "s/^/$name: /"
    "$m" merge --inject-skew "$skew" "$@" -o "$out/$name.skewed.ndjson" 2>/dev/null
    python3 "$here/skew-compare.py" "$out/$name.merged.ndjson" "$out/$name.skewed.ndjson" "$name ($skew)"
}

rm -rf "$out/demo"
"$m" demo --topology all --out "$out/demo" >"$out/demo.log" 2>&1
for t in direct one-hop two-hop two-hop-same-node; do
    d=$out/demo/$t
    check "demo-$t" "$d"/kernel-*.capture "$d"/probes-*.ndjson
    check "demo-$t-kernel-only" "$d"/kernel-*.capture
done

# redis-server (Debian's, unmodified), kernel-only.
a=mlrc-$$-a; b=mlrc-$$-b; r=$out/redis; rm -rf "$r"; mkdir -p "$r"
pids=()
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true
    ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$a"; ip netns add "$b"
ip link add "mlrca$$" type veth peer name "mlrcb$$"
ip link set "mlrca$$" netns "$a"; ip link set "mlrcb$$" netns "$b"
ip -n "$a" addr add 10.209.7.1/24 dev "mlrca$$"; ip -n "$b" addr add 10.209.7.2/24 dev "mlrcb$$"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "mlrca$$" up; ip -n "$b" link set "mlrcb$$" up
ip netns exec "$b" redis-server --bind 10.209.7.2 --port 6379 --save '' --appendonly no \
    --protected-mode no >/dev/null & pids+=($!)
for n in A B; do
    ns=$a; [ $n = B ] && ns=$b
    "$m" record --netns "/run/netns/$ns" --node $n --port 6379 -o "$r/$n.capture" \
        --ready-file "$r/$n.ready" 2>"$r/$n.log" & pids+=($!)
done
for _ in $(seq 100); do [ -f "$r/A.ready" ] && [ -f "$r/B.ready" ] && break; sleep 0.1; done
ip netns exec "$a" redis-benchmark -h 10.209.7.2 -p 6379 -c 1 -n 20000 -t ping_mbulk,set,get \
    -q >"$r/bench.txt"
kill -INT "${pids[1]}" "${pids[2]}"; wait "${pids[1]}" "${pids[2]}"
check redis-kernel-only "$r/A.capture" "$r/B.capture"

for d in "$@"; do
    check "$(basename "$d")" "$d"/a.capture "$d"/b.capture
done
