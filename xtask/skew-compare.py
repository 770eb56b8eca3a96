#!/usr/bin/env python3
"""Compares two merges of the same recordings, the second with --inject-skew: per trace id,
e2e, completeness and every segment's name, node, duration and error bound must be identical
(absolute times move with the skew and are not compared). Exits 1 when any request differs.

    skew-compare.py MERGED SKEWED NAME
"""
import json
import sys


def load(path):
    out = {}
    with open(path) as f:
        for line in f:
            v = json.loads(line)
            if v.get("type") == "request":
                segs = tuple(
                    (s["name"], s.get("node"), s["dur_ns"], s.get("error_ns"))
                    for s in v["segments"]
                )
                out[v["trace_id"]] = (v["e2e_ns"], v["complete"], segs)
    return out


base, skewed = load(sys.argv[1]), load(sys.argv[2])
same = sum(1 for k, v in base.items() if skewed.get(k) == v)
complete = sum(1 for v in base.values() if v[1])
print(
    f"{sys.argv[3]}: {len(base)} requests ({complete} complete), skewed merge {len(skewed)}, "
    f"{same} identical"
)
sys.exit(0 if same == len(base) == len(skewed) else 1)
