#!/bin/bash
# NIC frames whose IRQ came during a running NET_RX softirq, under load in the two 6.12 guests
# (docs/coverage-audit.md; meshlab-ebpf rx.rs `netif_context`).
#
#   xtask/vm-load-irq.sh MESHLAB [CONCURRENCY] [SECONDS] [RUNS]
#
# Boots the two qemu guests of `cargo xtask vm run` (private link 10.213.0.0/24 only) RUNS
# times: A records and runs `lab client --concurrency CONCURRENCY --qps 0` for SECONDS against
# B's lab server, B records with --raw-irq. Then, per run: B's netif_receive_skb events with a
# softirq entry and with a mid-run IRQ of their own (an IRQ and no softirq entry), the merged
# requests, how many of those with B's half are complete, and the merge's "network round trip
# would be negative" errors. MESHLAB is a meshlab binary (release or debug). Needs root, qemu
# and the prepared 6.12 boot files (`cargo xtask vm prepare`); ~20 s per run.
set -euo pipefail

meshlab=$(realpath "${1:?usage: $0 MESHLAB [CONCURRENCY] [SECONDS] [RUNS]}")
concurrency=${2:-32}
seconds=${3:-5}
runs=${4:-2}
root=$(git rev-parse --show-toplevel)
xtask=$root/target/debug/xtask
[ -x "$xtask" ] || (cd "$root" && cargo build -q -p xtask)
work=$(mktemp -d "$root/target/vm-load-irq.XXXXXX")
trap 'rm -rf "$work"' EXIT

m=$meshlab
for run in $(seq "$runs"); do
    d=$work/run$run
    mkdir -p "$d"
    a="trap 'touch \"\$MESHLAB_VM_SHARED/a.done\"' EXIT; $m record -o $d/a.capture --node A --port 9000 --duration 180s --ready-file /run/rec.ready & REC=\$!; while [ ! -f /run/rec.ready ]; do kill -0 \$REC 2>/dev/null || { echo 'the recorder exited before it was ready' >&2; exit 1; }; sleep 0.1; done; until [ -f \"\$MESHLAB_VM_SHARED/b.ready\" ]; do [ -f \"\$MESHLAB_VM_SHARED/b.done\" ] && exit 1; sleep 0.1; done; ok=; for i in \$(seq 120); do $m lab client --connect 10.213.0.2:9000 --warmup 0s --duration 1s > /dev/null && ok=1 && break; sleep 0.5; done; [ -n \"\$ok\" ] || exit 1; $m lab client --connect 10.213.0.2:9000 --concurrency $concurrency --qps 0 --warmup 0s --duration ${seconds}s > /dev/null || exit 1; kill -INT \$REC; wait \$REC"
    b="trap 'touch \"\$MESHLAB_VM_SHARED/b.done\"' EXIT; $m record -o $d/b.capture --node B --port 9000 --duration 180s --raw-irq --ready-file /run/rec.ready & REC=\$!; while [ ! -f /run/rec.ready ]; do kill -0 \$REC 2>/dev/null || { echo 'the recorder exited before it was ready' >&2; exit 1; }; sleep 0.1; done; $m lab server --listen 10.213.0.2:9000 & SRV=\$!; until grep -q ':2328 00000000:0000 0A' /proc/net/tcp; do sleep 0.1; done; touch \"\$MESHLAB_VM_SHARED/b.ready\"; for i in \$(seq 900); do [ -f \"\$MESHLAB_VM_SHARED/a.done\" ] && break; sleep 0.2; done; kill -INT \$SRV; wait \$SRV; kill -INT \$REC; wait \$REC"
    (cd "$root" && "$xtask" vm run --kernel 6.12 --timeout 300 --rw "$d" --a "$a" --b "$b") > "$d/vm.log" 2>&1 \
        || { tail -20 "$d/vm.log" >&2; exit 1; }
    "$meshlab" export "$d/b.capture" -o "$d/b.ndjson"
    "$meshlab" merge "$d/a.capture" "$d/b.capture" -o "$d/merged.ndjson" 2> "$d/merge.log"
    python3 - "$d" "$run" <<'EOF'
import json, sys
d, run = sys.argv[1], sys.argv[2]
entry = own = 0
for line in open(f"{d}/b.ndjson"):
    if '"netif_receive_skb"' in line:
        r = json.loads(line)
        entry += "softirq_entry_ns" in r
        own += "softirq_entry_ns" not in r and "irq_entry_ns" in r
requests = with_b = complete = negative = 0
for line in open(f"{d}/merged.ndjson"):
    r = json.loads(line)
    if r.get("type") == "request":
        requests += 1
        if not any(m.startswith("server") for m in r.get("missing", [])):
            with_b += 1
            complete += bool(r.get("complete"))
    elif "errors" in r:
        negative += sum("network round trip would be negative" in e for e in r["errors"])
drops = [l.split("kernel drops: ")[1].strip() for l in open(f"{d}/merge.log") if "kernel drops" in l]
print(f"run {run}: B netif_receive_skb with a softirq entry {entry}, with a mid-run IRQ of its own {own}; "
      f"requests {requests}, with B's half {with_b}, complete {complete} ({100 * complete / max(with_b, 1):.1f} %); "
      f"negative network round trips {negative}; kernel drops {drops[0] if drops else '?'}")
EOF
done
