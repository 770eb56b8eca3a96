#!/usr/bin/env python3
"""Classifies the requests of one demo topology run that miss only a reader's switch-in.

    missing_switch_in.py MESHLAB RUN_DIR OBSERVER_LOG

RUN_DIR holds merged.ndjson and kernel-<node>.capture (a `meshlab demo` topology directory);
OBSERVER_LOG is the output of xtask/missing-switch-in.sh's bpftrace observer over the same
time: lines `S ns cpu prev next prev_state` (sched_switch), and `Lost N events` if bpftrace
lost any (then no verdict of that run is evidence, and the tally says so).

For each request whose `missing` is exactly one `<node>:sched_switch`, it finds the wake-up
that starts the request's merged `rx_sched_delay+...` segment in the node's capture (the woken
thread), the thread's next event there other than a wake-up (its CPU: a wake-up is stamped
on the waker's), and asks the observer whether that thread was switched out before the
wake-up (else no switch-in was due), switched in between the two, and which task its CPU had
switched to last before. A thread the observer saw switched in at least twice but never out
is one whose switch-outs the kernel does not report (xtask/untraced-tasks.sh). Also prints
the node's recorder accounting (its capture's summary: hits, received, dropped). One line per
request and a tally; exit status 0.
"""
import bisect
import json
import subprocess
import sys
from collections import defaultdict


def merged_segment(req, node):
    """The segment a missing switch-in merged into: `rx_sched_delay+<next stage>`."""
    return next(
        (
            s
            for s in req["segments"]
            if s.get("node") == node and s["name"].startswith("rx_sched_delay+")
        ),
        None,
    )


def requests_missing_switch_in(merged):
    for line in open(merged):
        req = json.loads(line)
        if req.get("type") != "request" or req.get("complete", True):
            continue
        missing = req.get("missing", [])
        if len(missing) == 1 and missing[0].endswith(":sched_switch"):
            node = missing[0].split(":")[0]
            yield req["trace_id"], node, merged_segment(req, node)


def node_events(meshlab, capture):
    out = subprocess.run([meshlab, "export", capture], capture_output=True, text=True, check=True)
    return [json.loads(l) for l in out.stdout.splitlines()]


def recorder_accounting(records):
    """The recorder's summary: (hits, received, dropped) over every hook, or None."""
    summary = next((r for r in records if r.get("type") == "summary"), None)
    if summary is None:
        return None
    hooks = summary.get("per_hook", {}).values()
    return (
        sum(h.get("hits", 0) for h in hooks),
        summary.get("received"),
        summary.get("dropped"),
    )


class Observer:
    def __init__(self, log):
        self.switches = defaultdict(list)  # cpu -> [(ns, prev, next)]
        self.lost = 0
        switched_in, switched_out = defaultdict(int), set()
        for line in open(log):
            f = line.split()
            if f[:1] == ["Lost"]:
                self.lost += int(f[1])
            elif len(f) >= 5 and f[0] == "S":
                ns, cpu, prev, nxt = int(f[1]), int(f[2]), int(f[3]), int(f[4])
                self.switches[cpu].append((ns, prev, nxt))
                switched_out.add(prev)
                switched_in[nxt] += 1
        for s in self.switches.values():
            s.sort()
        self.unreported = {t for t, n in switched_in.items() if n >= 2 and t not in switched_out}

    def switches_of(self, tid, lo, hi, field):
        """How many switches in (lo, hi) have `tid` as prev (field 1) or next (field 2)."""
        return sum(
            1 for s in self.switches.values() for e in s if e[field] == tid and lo < e[0] < hi
        )

    def last_switch_before(self, cpu, ns):
        s = self.switches.get(cpu, [])
        i = bisect.bisect_left(s, (ns, -1, -1))
        return s[i - 1] if i else None


def classify(observer, events, node, seg):
    """One request's line and its tally key."""
    if seg is None:
        return f"{node}: no rx_sched_delay+ segment", "no merged segment"
    wake_ns = seg["start_ns"]
    wake = next(
        (e for e in events if e.get("hook") == "sched_wakeup" and e.get("ts_ns") == wake_ns), None
    )
    if wake is None:
        return f"{node}: no sched_wakeup at {wake_ns} in the capture", "no wake-up found"
    tid = wake["tid"]
    later = [
        e
        for e in events
        if e.get("tid") == tid and e.get("ts_ns", 0) > wake_ns and e.get("hook") != "sched_wakeup"
    ]
    if not later:
        return f"{node}: thread {tid} has no event after its wake-up", "no later event"
    after = min(later, key=lambda e: e["ts_ns"])
    # Switched out in the second before the wake-up: the thread was asleep, a switch-in due.
    asleep = observer.switches_of(tid, wake_ns - 1_000_000_000, wake_ns, 1) > 0
    seen = observer.switches_of(tid, wake_ns, after["ts_ns"], 2)
    last = observer.last_switch_before(after["cpu"], after["ts_ns"])
    before = last[2] if last else None
    unreported = before in observer.unreported
    line = (
        f"{node}: thread {tid} woken at {wake_ns} (switched out before: {asleep}), next event "
        f"{after['hook']} on cpu {after['cpu']} at {after['ts_ns']}; observer switch-ins "
        f"between: {seen}; that cpu last switched to {before} "
        f"({'never reported switching out' if unreported else 'reported switching out'})"
    )
    if seen > 0:
        return line, "observer saw the switch-in"
    if not asleep:
        return line, "observer missed it too, but the thread was not seen asleep"
    if unreported:
        return line, "observer missed it too, cpu last ran a thread never reported switching out"
    return line, "observer missed it too, other"


def main():
    meshlab, run_dir, log = sys.argv[1:4]
    observer = Observer(log)
    captures = {}
    tally = defaultdict(int)
    for trace_id, node, seg in requests_missing_switch_in(f"{run_dir}/merged.ndjson"):
        if node not in captures:
            captures[node] = node_events(meshlab, f"{run_dir}/kernel-{node}.capture")
            accounting = recorder_accounting(captures[node])
            print(f"node {node}: recorder (hits, received, dropped) = {accounting}")
        line, key = classify(observer, captures[node], node, seg)
        print(f"{trace_id}: {line}")
        tally[key] += 1
    if observer.lost:
        print(f"observer LOST {observer.lost} events: no verdict above is evidence")
        tally["observer lost events"] += 1
    for what, n in sorted(tally.items()):
        print(f"tally: {n} {what}")


if __name__ == "__main__":
    main()
