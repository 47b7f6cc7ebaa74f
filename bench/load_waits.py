#!/usr/bin/env python3
"""Finds global loads that a kernel waits for one at a time: runs of loads, in one stretch of code
(no backward branch between them), each of whose results is used before the next load is issued.
A thread then has one load in flight where it could have had the whole run, and a kernel bound by
memory runs at a fraction of the bandwidth. The usual cause is a load under a condition
(`i < n ? x[i] : 0`, a storage chosen at run time): the compiler puts the load and its first use in
one branch and closes the branch before the next load. crossentropy_split_fwd had it (1.73 ms a seed
batch-32 step; 1.04 once its loads went out together), and a first version of flash_bwd_delta with
4 rows a warp ran slower than one row a warp for it (135 against 76 µs a call; 26 without it):
bench/results/2026-12-04-delta-rows.

Compiles the given .cu files, or every kernels/*.cu file (cast.cu also as the computed-source
family), for sm_90 with NVRTC (bench/kernel_regs.py, no GPU needed), disassembles them with nvdisasm
(the nvidia-cuda-nvdisasm wheel, or $NVDISASM), and prints each kernel with a run of at least
--min-run such loads (default 4). Exit status 1 when one is found, 2 on bad input.

Usage: bench/load_waits.py [--min-run N] [FILE.cu ... | --sass FILE.sass]
(default: every kernels/*.cu file; --sass reads `nvdisasm -c` output instead of compiling).
tests/bench_summary.rs runs it on the kernels it was fixed in and on a known-bad SASS fixture."""
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sass_diff import kernel_lines, listing, nvdisasm  # noqa: E402

LOAD = re.compile(r"\bLDG\.[A-Z0-9.]*\s+(R\d+)")
OFFSET = re.compile(r"/\*([0-9a-f]{4,})\*/")
BRANCH = re.compile(r"\bBRA\b[^`]*`\(([^)]+)\)")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")


def regs_read(ins, dest):
    """Whether the instruction reads register `dest` (any operand after its destination)."""
    ops = ins.split(None, 1)
    if len(ops) < 2:
        return False
    text = ops[1]
    if text.startswith("@"):
        text = text.split(None, 1)[1] if " " in text else ""
    parts = text.split(None, 1)
    if len(parts) < 2:
        return False
    operands = parts[1]
    # A store or a branch has no destination; otherwise skip the first operand (the destination).
    if not re.match(r"(ST|BRA|BSYNC|EXIT|RET|BAR)", parts[0]):
        operands = operands.split(",", 1)[1] if "," in operands else ""
    return re.search(r"\b" + dest + r"\b", operands) is not None


def predicate(ins):
    """The instruction's guard predicate (`P4`, `!P4`), or None."""
    m = re.match(r"@(!?U?P\d)\s", ins)
    return m.group(1) if m else None


def waited_runs(body):
    """Lengths of the runs of loads each used before the next load is issued, along each path: a
    load under a predicate (`@P4`) and one under its opposite (`@!P4`) are alternatives (the two
    storages of `bf16 ? u16 : f32`), so the runs are counted once for the loads under no predicate
    or P, once for those under no predicate or !P, for each P."""
    labels = {}
    ins = []
    for line in body:
        lm = LABEL.match(line)
        if lm:
            labels[lm.group(1)] = len(ins)
            continue
        m = OFFSET.search(line)
        if m and ";" in line:
            ins.append(line.split("*/", 1)[1].strip())
    preds = {predicate(t) for t in ins if LOAD.search(t)} - {None}
    paths = [None] + sorted(preds)
    best = []
    for path in paths:
        on_path = lambda t: predicate(t) in (None, path)  # noqa: E731
        runs, run = [], 0
        for i, text in enumerate(ins):
            b = BRANCH.search(text)
            if b and labels.get(b.group(1), len(ins)) <= i:
                # A backward branch (a loop): a run does not continue around it.
                if run:
                    runs.append(run)
                run = 0
                continue
            m = LOAD.search(text)
            if not m or not on_path(text):
                continue
            dest = m.group(1)
            used_first = False
            for later in ins[i + 1:]:
                if LOAD.search(later) and on_path(later):
                    break
                if regs_read(later, dest):
                    used_first = True
                    break
            if used_first:
                run += 1
            else:
                if run:
                    runs.append(run)
                run = 0
        if run:
            runs.append(run)
        if max(runs, default=0) > max(best, default=0):
            best = runs
    return best


def report(source, sass, min_run):
    """Prints the kernels of one listing with a run of at least min_run; returns how many."""
    found = 0
    for name, body in kernel_lines(sass).items():
        runs = [r for r in waited_runs(body) if r >= min_run]
        if runs:
            found += 1
            print(f"{source}: {name}: runs of loads waited for one at a time: {runs}")
    return found


def main():
    args = sys.argv[1:]
    min_run = 4
    if "--min-run" in args:
        i = args.index("--min-run")
        try:
            min_run = int(args[i + 1])
        except (IndexError, ValueError):
            print("load_waits.py: --min-run needs a whole number", file=sys.stderr)
            sys.exit(2)
        del args[i:i + 2]
    if min_run < 1:
        print("load_waits.py: --min-run must be at least 1", file=sys.stderr)
        sys.exit(2)
    if "--sass" in args:
        i = args.index("--sass")
        if i + 1 >= len(args) or not os.path.isfile(args[i + 1]):
            print("load_waits.py: --sass needs an nvdisasm listing", file=sys.stderr)
            sys.exit(2)
        sass = open(args[i + 1]).read()
        found = report(os.path.basename(args[i + 1]), sass, min_run)
        print(f"{found} kernel(s) with a run of {min_run} or more")
        sys.exit(1 if found else 0)
    kernels_dir = os.path.join(HERE, "..", "kernels")
    if args:
        for f in args:
            if not f.endswith(".cu") or not os.path.isfile(f):
                print(f"load_waits.py: {f}: not a .cu file", file=sys.stderr)
                sys.exit(2)
        units = [(f, []) for f in args]
    else:
        units = [(os.path.join(kernels_dir, f), []) for f in sorted(os.listdir(kernels_dir)) if f.endswith(".cu")]
        units.append((os.path.join(kernels_dir, "cast.cu"), ["-D", "CAST_SRC_UNIT"]))
    tool = nvdisasm()
    found = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k, (path, extra) in enumerate(units):
            cubin = os.path.join(tmp, f"{k}.cubin")
            r = subprocess.run([sys.executable, os.path.join(HERE, "kernel_regs.py"), path, "--cubin", cubin] + extra,
                               capture_output=True, text=True)
            if r.returncode != 0 or not os.path.exists(cubin):
                sys.exit(f"load_waits.py: {path} did not compile: {r.stderr.strip() or r.stdout.strip()}")
            found += report(os.path.basename(path), listing(tool, cubin), min_run)
    print(f"{found} kernel(s) with a run of {min_run} or more")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
