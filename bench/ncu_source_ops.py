#!/usr/bin/env python3
"""Where a kernel's instructions go, from Nsight Compute's per-instruction source page: the SASS
opcodes executed, weighted by how often each instruction ran, and the hot loop (the instructions run
at least HOT times; by default 90% of the count most instructions share) opcode by opcode; given a second kernel, the
difference between the two, e.g. a cast kernel at two statistics levels.

The source page comes from a report taken with the SourceCounters section:
  ncu --section SourceCounters ... -o REP fp8-capture train ...
  ncu -i REP.ncu-rep --page source --csv --print-source sass | gzip > source.csv.gz
(bench/results/2026-12-02-host-overlap/call1/command.sh ran exactly this.)

Usage: bench/ncu_source_ops.py SOURCE.csv[.gz] KERNEL [SOURCE2.csv[.gz] KERNEL2] [--hot N]"""
import collections
import csv
import gzip
import sys


def load(path):
    """{kernel name: [row dict]} from a source page export (one block per profiled kernel)."""
    kernels, cur, hdr = {}, None, None
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                cur, hdr = row[1], None
                kernels[cur] = []
            elif row[0] == "Address":
                hdr = row
            elif hdr and cur:
                kernels[cur].append(dict(zip(hdr, row)))
    return kernels


def opcode(sass):
    """The opcode of a SASS line with its modifiers (IMAD.MOV.U32), the predicate left out."""
    t = sass.split()
    if t and t[0].startswith("@"):
        t = t[1:]
    return t[0] if t else "?"


def profile(rows, hot):
    """(warp instructions executed, stall samples, {opcode: executed}, {opcode: count in the hot loop},
    hot-loop length, its execution count)."""
    runs = [int(r["Instructions Executed"] or 0) for r in rows]
    # The hot loop's body: the execution count most instructions share (a branch-free body runs
    # every instruction as often), less 10% for the ones a rare branch skips.
    counts = collections.Counter(n for n in runs if n > 0)
    mode = max(counts, key=lambda n: (counts[n], n)) if counts else 0
    threshold = hot if hot is not None else int(0.9 * mode)
    executed, in_loop = collections.Counter(), collections.Counter()
    samples = 0
    for r, n in zip(rows, runs):
        op = opcode(r["Source"])
        executed[op.split(".")[0]] += n
        samples += int(r["Warp Stall Sampling (All Samples)"] or 0)
        if n >= threshold and n > 0:
            in_loop[op] += 1
    return sum(runs), samples, executed, in_loop, sum(in_loop.values()), threshold


def main():
    args = sys.argv[1:]
    hot = None
    if "--hot" in args:
        i = args.index("--hot")
        hot = int(args[i + 1])
        del args[i:i + 2]
    if len(args) not in (2, 4):
        sys.exit(__doc__)
    found = []
    for path, name in zip(args[::2], args[1::2]):
        kernels = load(path)
        if name not in kernels:
            sys.exit(f"ncu_source_ops.py: {path} holds no kernel {name} (it holds: {', '.join(kernels)})")
        found.append((name, profile(kernels[name], hot)))
    for name, (total, samples, executed, _, loop_len, threshold) in found:
        print(f"== {name}: {total / 1e6:.1f} M warp instructions, {samples} stall samples; "
              f"hot loop {loop_len} instructions, each run {threshold} times or more")
        for op, n in executed.most_common(12):
            print(f"  {op:12s} {n / 1e6:8.2f} M")
    if len(found) == 2:
        (a, pa), (b, pb) = found
        print(f"== hot loop, {a} minus {b}: {pa[4]} - {pb[4]} = {pa[4] - pb[4]:+d} instructions")
        la, lb = pa[3], pb[3]
        for op in sorted(set(la) | set(lb), key=lambda o: -(la[o] - lb[o])):
            if la[op] != lb[op]:
                print(f"  {op:24s} {la[op]:5d} {lb[op]:5d} {la[op] - lb[op]:+5d}")


if __name__ == "__main__":
    main()
