#!/bin/bash
# What the ring buffer record costs a traced program (issue 10; docs/benchmarks-kernel.md,
# "The ring record's share").
#
#   xtask/ring-cost.sh BASELINE_MESHLAB [ROUNDS]
#
# Builds this tree (HEAD) with xtask/profile/ring-cost.patch applied, in a throwaway worktree
# and target directory: every event is then built in a per-CPU slot and never reserved,
# submitted or paced (the recorder receives nothing), all else unchanged. Runs `cargo xtask
# bench kernel-ab --rung tracing-all` of that build against BASELINE_MESHLAB (a release build of
# HEAD) under redis PING across two namespaces and prints, per program, both medians, the
# difference (the ring record's cost per run) and BPF time per request of both builds (runs x
# ns/run / requests, summed). Needs root; one release build plus ~1 min at 5 rounds.
set -euo pipefail

baseline=${1:?usage: $0 BASELINE_MESHLAB [ROUNDS]}
rounds=${2:-5}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d /tmp/meshlab-ring-cost.XXXXXX)
cleanup() {
    git -C "$root" worktree remove --force "$work/tree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

git -C "$root" worktree add --quiet --detach "$work/tree" HEAD
git -C "$work/tree" apply "$root/xtask/profile/ring-cost.patch"
echo "ring-cost: building the ring-less recorder in $work" >&2
(cd "$work/tree" && CARGO_TARGET_DIR="$work/target" cargo build --quiet --release -p meshlab-user)
cp "$work/target/release/meshlab" "$work/meshlab-no-ring"

report="$work/kernel-ab.md"
(cd "$root" && cargo xtask bench kernel-ab --baseline "$baseline" --candidate "$work/meshlab-no-ring" \
    --rounds "$rounds" --rung tracing-all >"$report" 2>"$report.err") || {
    cat "$report.err" >&2
    exit 1
}
head -1 "$report"
requests=$(sed -n 's/^Workload:.*(\([0-9]*\) requests per run).*/\1/p' "$report")
# Rows of the tracing-all table: | program | runs | baseline | candidate | ... |
awk -F'|' -v requests="$requests" '
    /^### / { table = ($0 ~ /tracing all/) }
    table && NF > 6 && $2 !~ /program|---/ {
        p = $2; gsub(/ /, "", p); runs = $3 + 0; b = $4 + 0; c = $5 + 0
        if (p == "empty_floor") { floor = c; next }
        rows[++n] = sprintf("| %s | %.1f | %.1f | %.1f | %.1f |", p, runs / requests, b, c, b - c)
        tb += runs * b; tc += runs * c
    }
    END {
        print "| program | runs/request | with ring ns/run | without ns/run | ring ns/run |"
        print "|---|---:|---:|---:|---:|"
        for (i = 1; i <= n; i++) print rows[i]
        printf "\nempty floor program (candidate) %.1f ns/run; BPF time per request: with ring %.2f us, without %.2f us\n", floor, tb / requests / 1000, tc / requests / 1000
    }' "$report"
