#!/bin/bash
# prog-sizes.sh MESHLAB [record flags...]
#
# Starts `MESHLAB record --attach always` (port 1: nothing is traced) with the given flags,
# prints `name bytes_xlated bytes_jited` of every BPF program that recorder holds (its
# /proc/PID/fdinfo prog_ids, so other recorders on the machine are left out), and stops it.
# Sizes after the verifier: what a read-only switch removes shows here. Needs root and bpftool.
set -euo pipefail
meshlab=$1
shift
dir=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ]; then kill -INT "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT
"$meshlab" record --attach always --port 1 --output "$dir/rec.ndjson" --format ndjson \
    --ready-file "$dir/ready" "$@" 2>"$dir/stderr" &
pid=$!
for _ in $(seq 150); do
    [ -e "$dir/ready" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/stderr" >&2; exit 1; }
    sleep 0.2
done
[ -e "$dir/ready" ] || { echo "recorder not ready after 30 s" >&2; exit 1; }
ids=$(grep -h '^prog_id:' /proc/"$pid"/fdinfo/* 2>/dev/null | awk '{print $2}' | sort -u | tr '\n' ' ')
bpftool prog show --json | IDS="$ids" python3 -c '
import json, os, sys
ids = {int(i) for i in os.environ["IDS"].split()}
for p in sorted(json.load(sys.stdin), key=lambda p: p.get("name", "")):
    if p["id"] in ids:
        print(p.get("name"), p.get("bytes_xlated"), p.get("bytes_jited"))'
