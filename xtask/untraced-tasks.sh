#!/usr/bin/env bash
# Threads whose switches *out* the kernel never reports: watches sched:sched_switch for
# SECONDS (default 10, a whole number) twice, once with bpftrace (BPF) and once through a
# private ftrace instance (no BPF), and lists every thread seen switched in (as `next`) at
# least twice but never switched out (as `prev`): one switch-in alone can be a thread still
# running when the window ends; two without a switch-out between them are a switch-out not
# reported. The tracepoint fires in the context of `prev`, so a switch *from* such a thread is
# invisible to `meshlab record` too, and a traced thread switched in straight from it has no
# switch-in event (docs/coverage-audit.md, "Scheduler: switches the kernel does not report").
#
#   sudo xtask/untraced-tasks.sh [SECONDS]
#
# Per such thread: switch-ins seen by BPF, its system calls seen by BPF
# (`raw_syscalls:sys_enter` fires in the caller's context), switch-ins and switch-outs seen by
# ftrace, its process and name; then a total. Exit status 0 whether or not any are found, 1
# when bpftrace or tracefs fails. Traffic: none. Clean-up: the ftrace instance is removed on
# exit, also on failure or a signal; the machine's own trace buffer is not touched.
set -euo pipefail
seconds=${1:-10}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "SECONDS must be a whole number: $seconds" >&2; exit 2; }
out=$(mktemp); err=$(mktemp); ftrace_out=$(mktemp)
tracefs=/sys/kernel/tracing; [ -d "$tracefs/instances" ] || tracefs=/sys/kernel/debug/tracing
instance="$tracefs/instances/meshlab-untraced-$$"
cleanup() { rm -f "$out" "$err" "$ftrace_out"; [ -d "$instance" ] && rmdir "$instance" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Pass 1, BPF. Keys are thread ids; `exit()` prints the maps in bpftrace's `@map[key]: value`.
prog='tracepoint:sched:sched_switch { @in[args->next_pid] = count(); @out[args->prev_pid] = count(); }
tracepoint:raw_syscalls:sys_enter { @sys[tid] = count(); }
interval:s:'"$seconds"' { exit(); }'
if ! bpftrace -e "$prog" >"$out" 2>"$err"; then
    grep -v RLIMIT_MEMLOCK "$err" >&2 || true
    echo "bpftrace failed" >&2
    exit 1
fi

# Pass 2, ftrace (no BPF), in an instance of its own.
mkdir "$instance" || { echo "cannot create an ftrace instance under $tracefs" >&2; exit 1; }
echo 1 >"$instance/events/sched/sched_switch/enable"
sleep "$seconds"
echo 0 >"$instance/tracing_on"
grep -o 'prev_pid=[0-9]*\|next_pid=[0-9]*' "$instance/trace" >"$ftrace_out" || true

awk -F'[][]|: |=' '
    FILENAME == ARGV[1] && /^@in\[/  { seen_in[$2] = $4 }
    FILENAME == ARGV[1] && /^@out\[/ { seen_out[$2] = $4 }
    FILENAME == ARGV[1] && /^@sys\[/ { syscalls[$2] = $4 }
    FILENAME == ARGV[2] && $1 == "next_pid" { ftrace_in[$2]++ }
    FILENAME == ARGV[2] && $1 == "prev_pid" { ftrace_out[$2]++ }
    END {
        hidden = 0
        for (tid in seen_in) if (tid != 0 && seen_in[tid] >= 2 && !(tid in seen_out)) {
            comm = ""; tgid = "?"
            f = "/proc/" tid "/comm"; if ((getline comm < f) <= 0) comm = "(exited)"; close(f)
            s = "/proc/" tid "/status"
            while ((getline line < s) > 0) if (line ~ /^Tgid:/) { split(line, a, /\t/); tgid = a[2] }
            close(s)
            printf "unreported tid %s: BPF saw %s switch-ins, no switch-out, %d system calls; ftrace saw %d switch-ins, %d switch-outs (tgid %s, %s)\n", tid, seen_in[tid], syscalls[tid], ftrace_in[tid], ftrace_out[tid], tgid, comm
            hidden++
        }
        printf "%d thread(s) switched in twice or more but never out in '"$seconds"' s (BPF); %d thread(s) seen switching out\n", hidden, length(seen_out)
    }' "$out" "$ftrace_out"
