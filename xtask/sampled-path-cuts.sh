#!/bin/bash
# Where the sampled path's time goes, point by point (issue 10; docs/benchmarks-kernel-sampled.md).
#
#   xtask/sampled-path-cuts.sh BASELINE_MESHLAB [ROUNDS] [CUT...]
#
# Builds this tree (HEAD) with xtask/profile/sampled-path-cuts.patch applied, in a throwaway
# worktree and target directory: skb_copy_datagram_iovec, sched_switch and netif_receive_skb
# then return at cut point MESHLAB_EXP_CUT (the patch's comments list them). For each cut,
# `cargo xtask bench kernel-ab --rung sampled` runs that build against BASELINE_MESHLAB
# (e.g. a release build of HEAD) under redis PING across two namespaces, sampling 1/100
# messages, and this prints the candidate's median ns/run of the three programs and of the
# empty floor program. The difference between two cuts of one program is what the code
# between them costs. Needs root (kernel-ab attaches programs); ~1 min per cut at 3 rounds
# plus one release build.
set -euo pipefail

baseline=${1:?usage: $0 BASELINE_MESHLAB [ROUNDS] [CUT...]}
rounds=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
cuts=${*:-"1 2 3 4 5 6 8 0 11 15 12 16 17 13 14"}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d /tmp/meshlab-cuts.XXXXXX)
cleanup() {
    git -C "$root" worktree remove --force "$work/tree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

git -C "$root" worktree add --quiet --detach "$work/tree" HEAD
git -C "$work/tree" apply "$root/xtask/profile/sampled-path-cuts.patch"
echo "sampled-path-cuts: building the instrumented recorder in $work" >&2
(cd "$work/tree" && CARGO_TARGET_DIR="$work/target" cargo build --quiet --release -p meshlab-user)
cp "$work/target/release/meshlab" "$work/meshlab-cuts"

# The candidate's ns/run of `program` in a kernel-ab report (column 4 of its row).
ns_per_run() {
    awk -F'|' -v p=" $2 " '$2 == p { gsub(/ /, "", $5); print $5; exit }' "$1"
}

echo "| cut | empty_floor | skb_copy_btf | sched_switch_btf | netif_receive_skb_btf |"
echo "|---:|---:|---:|---:|---:|"
for cut in $cuts; do
    report="$work/cut$cut.md"
    (cd "$root" && MESHLAB_EXP_CUT=$cut cargo xtask bench kernel-ab --baseline "$baseline" \
        --candidate "$work/meshlab-cuts" --rounds "$rounds" --rung sampled >"$report" 2>"$report.err") || {
        cat "$report.err" >&2
        exit 1
    }
    row="| $cut"
    for program in empty_floor skb_copy_btf sched_switch_btf netif_receive_skb_btf; do
        row="$row | $(ns_per_run "$report" "$program")"
    done
    echo "$row |"
done
