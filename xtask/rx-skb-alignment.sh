#!/bin/bash
# Where in its cache lines a received skb sits when recvmsg copies it (docs/benchmarks-kernel-sampled.md).
#
#   xtask/rx-skb-alignment.sh [REQUESTS]
#
# Runs redis-server on a loopback port and redis-benchmark PING (c=1) against it, and counts
# with bpftrace the skb addresses seen by skb:skb_copy_datagram_iovec, modulo 512. Over
# loopback (and veth) the receiver gets the sender's TCP clone, the second sk_buff of a
# `struct sk_buff_fclones`, so it does not start on a cache line: a read of skb->sk then
# lands in the line shared with the end of the sender's original skb. Loopback traffic only;
# needs root and bpftrace.
set -euo pipefail

requests=${1:-20000}
port=7379
work=$(mktemp -d /tmp/meshlab-skbalign.XXXXXX)
server_pid=""
cleanup() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no >"$work/redis.log" 2>&1 &
server_pid=$!
for _ in $(seq 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
done

bpftrace -q -e 'tracepoint:skb:skb_copy_datagram_iovec { @skb_addr_mod_512[(uint64)args->skbaddr % 512] = count(); }' \
    >"$work/bpftrace.out" 2>"$work/bpftrace.err" &
tracer=$!
# bpftrace needs about a second to attach; requests sent before are only not counted.
sleep 3
redis-benchmark -h 127.0.0.1 -p "$port" -c 1 -n "$requests" -t ping -q >/dev/null
kill -INT "$tracer"
wait "$tracer" || true
echo "skb addresses at skb_copy_datagram_iovec, modulo 512 (redis PING over loopback, $requests requests):"
grep '^@' "$work/bpftrace.out" | sort -t: -k2 -n -r
