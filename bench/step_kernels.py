#!/usr/bin/env python3
"""A training step's kernels by name, from Nsight Compute's CSV of gpu__time_duration.sum
(bench/step_kernels.sh): launches and GPU microseconds a step, summed over the steps after the
first, heaviest first, and the total a step. Steps are split at each launch of embedding_fwd, the
first kernel of fp8-capture's step; launches before the first one (initialisation) are dropped.

Usage: step_kernels.py CSV [--steps N] [--top K]
"""
import argparse
import csv
import sys
from collections import defaultdict

UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
STEP_START = "embedding_fwd"


def launches(path):
    """(kernel name, µs) a launch, in launch order."""
    try:
        with open(path, newline="") as f:
            lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not CSV rows
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"{path}: no ncu rows (see the .err file beside it)")
    out = []
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        if unit not in UNITS:
            sys.exit(f"{path}: unknown time unit {unit!r}")
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            sys.exit(f"{path}: row {r.get('ID', '?')} has no time value")
        out.append((r["Kernel Name"], value * UNITS[unit]))
    return out


def per_step(seq):
    """The launches split into steps at each STEP_START, initialisation dropped."""
    steps, cur = [], None
    for name, us in seq:
        if name.startswith(STEP_START):
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append((name, us))
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=3, help="steps the run trained (a check of the split)")
    ap.add_argument("--top", type=int, default=60)
    a = ap.parse_args()
    steps = per_step(launches(a.csv))
    if len(steps) != a.steps:
        print(f"note: {len(steps)} steps found in the launches, {a.steps} expected", file=sys.stderr)
    kept = steps[1:]
    if not kept:
        sys.exit(f"{a.csv}: fewer than two steps recorded")
    calls, us = defaultdict(int), defaultdict(float)
    for s in kept:
        for name, t in s:
            calls[name] += 1
            us[name] += t
    n = len(kept)
    total = sum(us.values()) / n
    print(f"{n} steps after the first; kernels' GPU time a step {total / 1000:.3f} ms, {sum(calls.values()) / n:.1f} launches")
    print(f"{'ms a step':>10} {'launches':>9} {'µs each':>9}  kernel")
    for name in sorted(us, key=lambda k: -us[k])[: a.top]:
        print(f"{us[name] / n / 1000:10.3f} {calls[name] / n:9.1f} {us[name] / calls[name]:9.1f}  {name[:150]}")


if __name__ == "__main__":
    main()
