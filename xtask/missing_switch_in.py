#!/usr/bin/env python3
"""Classifies the requests of one demo topology run that miss only a reader's switch-in.

    missing_switch_in.py MESHLAB RUN_DIR BPFTRACE_LOG

RUN_DIR holds merged.ndjson and kernel-<node>.capture (a `meshlab demo` topology directory);
BPFTRACE_LOG is the output of xtask/missing-switch-in.sh's observer over the same time:
lines `S ns cpu prev next prev_state` (sched_switch) and `W ns cpu pid target_cpu`.

For each request whose `missing` is exactly one `<node>:sched_switch`, it finds the wake-up
that starts the request's `rx_sched_delay...` segment in the node's capture (the woken
thread), the thread's next event there (its CPU), and asks the observer whether that thread
was switched in between the two, and which task its CPU had switched to last before. A
thread the observer saw switched in but never out anywhere in the log is one in whose
context no BPF program runs (xtask/bpf-hidden-tasks.sh). Prints one line per request and a
tally; exit status 0.
"""
import bisect
import json
import subprocess
import sys
from collections import defaultdict


def requests_missing_switch_in(merged):
    for line in open(merged):
        req = json.loads(line)
        if req.get("type") != "request" or req.get("complete", True):
            continue
        missing = req.get("missing", [])
        if len(missing) == 1 and missing[0].endswith(":sched_switch"):
            node = missing[0].split(":")[0]
            seg = next(
                s
                for s in req["segments"]
                if s.get("node") == node and s["name"].startswith("rx_sched_delay")
            )
            yield req["trace_id"], node, seg["start_ns"], seg["start_ns"] + seg["dur_ns"]


def node_events(meshlab, capture):
    out = subprocess.run([meshlab, "export", capture], capture_output=True, text=True, check=True)
    events = [json.loads(l) for l in out.stdout.splitlines()]
    return [e for e in events if "hook" in e and "ts_ns" in e]


class Observer:
    def __init__(self, log):
        self.switches = defaultdict(list)  # cpu -> [(ns, prev, next)]
        seen_out, seen_in = set(), set()
        for line in open(log):
            f = line.split()
            if len(f) >= 5 and f[0] == "S":
                ns, cpu, prev, nxt = int(f[1]), int(f[2]), int(f[3]), int(f[4])
                self.switches[cpu].append((ns, prev, nxt))
                seen_out.add(prev)
                seen_in.add(nxt)
        for s in self.switches.values():
            s.sort()
        self.hidden = {t for t in seen_in - seen_out if t != 0}

    def switch_ins(self, tid, lo, hi):
        return sum(
            1 for s in self.switches.values() for (ns, _, nxt) in s if nxt == tid and lo < ns < hi
        )

    def last_switch_before(self, cpu, ns):
        s = self.switches.get(cpu, [])
        i = bisect.bisect_left(s, (ns, -1, -1))
        return s[i - 1] if i else None


def main():
    meshlab, run_dir, log = sys.argv[1:4]
    observer = Observer(log)
    captures = {}
    tally = defaultdict(int)
    for trace_id, node, wake_ns, end_ns in requests_missing_switch_in(f"{run_dir}/merged.ndjson"):
        if node not in captures:
            captures[node] = node_events(meshlab, f"{run_dir}/kernel-{node}.capture")
        events = captures[node]
        wake = next((e for e in events if e["hook"] == "sched_wakeup" and e["ts_ns"] == wake_ns), None)
        if wake is None:
            print(f"{trace_id}: {node}: no sched_wakeup at {wake_ns} in the capture")
            tally["no wake-up found"] += 1
            continue
        tid = wake["tid"]
        after = next((e for e in events if e["tid"] == tid and e["ts_ns"] > wake_ns), None)
        if after is None:
            print(f"{trace_id}: {node}: thread {tid} has no event after its wake-up")
            tally["no later event"] += 1
            continue
        seen = observer.switch_ins(tid, wake_ns, after["ts_ns"])
        last = observer.last_switch_before(after["cpu"], after["ts_ns"])
        before = last[2] if last else None
        hidden = before in observer.hidden
        print(
            f"{trace_id}: {node}: thread {tid} woken at {wake_ns}, next event {after['hook']} "
            f"on cpu {after['cpu']} at {after['ts_ns']}; observer switch-ins between: {seen}; "
            f"that cpu last switched to {before} ({'hidden' if hidden else 'seen switching out'})"
        )
        if seen == 0 and hidden:
            tally["observer missed it too, cpu last ran a hidden task"] += 1
        elif seen == 0:
            tally["observer missed it too, other"] += 1
        else:
            tally["observer saw the switch-in"] += 1
    for what, n in sorted(tally.items()):
        print(f"tally: {n} {what}")


if __name__ == "__main__":
    main()
