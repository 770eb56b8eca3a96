#!/usr/bin/env bash
# Tasks this kernel runs without running BPF programs in their context: watches
# sched:sched_switch for SECONDS (default 10) with bpftrace and lists every thread seen being
# switched in (as `next`) but never switched out (as `prev`). The sched_switch tracepoint fires
# in the context of `prev`, so a thread whose switch-outs never reach BPF is one in whose
# context no BPF program runs; every switch *from* it is invisible, also to `meshlab record`,
# and a traced thread switched in straight from it has no switch-in event
# (docs/coverage-audit.md, "Scheduler: switches from tasks BPF does not see").
#
#   sudo xtask/bpf-hidden-tasks.sh [SECONDS]
#
# Prints one line per such thread (tid, switch-ins seen, system calls seen: raw_syscalls:sys_enter
# runs in the caller's context, so 0 there too, its process and name) and a total;
# exit status 0 whether or not any are found, 1 when bpftrace fails. Traffic: none.
set -euo pipefail
seconds=${1:-10}
out=$(mktemp); err=$(mktemp); trap 'rm -f "$out" "$err"' EXIT
# Keys are thread ids; `exit()` prints both maps in bpftrace's `@map[key]: value` form.
prog='tracepoint:sched:sched_switch { @in[args->next_pid] = count(); @out[args->prev_pid] = count(); }
tracepoint:raw_syscalls:sys_enter { @sys[tid] = count(); }
interval:s:'"$seconds"' { exit(); }'
if ! bpftrace -e "$prog" >"$out" 2>"$err"; then
    grep -v RLIMIT_MEMLOCK "$err" >&2 || true
    echo "bpftrace failed" >&2
    exit 1
fi
awk -F'[][]|: ' '
    /^@in\[/  { seen_in[$2] = $4 }
    /^@out\[/ { seen_out[$2] = $4 }
    /^@sys\[/ { syscalls[$2] = $4 }
    END {
        hidden = 0
        for (tid in seen_in) if (tid != 0 && !(tid in seen_out)) {
            comm = ""; tgid = "?"
            f = "/proc/" tid "/comm"; if ((getline comm < f) <= 0) comm = "(exited)"; close(f)
            s = "/proc/" tid "/status"
            while ((getline line < s) > 0) if (line ~ /^Tgid:/) { split(line, a, /\t/); tgid = a[2] }
            close(s)
            printf "hidden tid %s: switched in %s times, never out; %d system calls seen (tgid %s, %s)\n", tid, seen_in[tid], syscalls[tid], tgid, comm
            hidden++
        }
        printf "%d thread(s) switched in but never out in '"$seconds"' s; %d thread(s) seen switching out\n", hidden, length(seen_out)
    }' "$out"
