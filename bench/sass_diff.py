#!/usr/bin/env python3
"""Whether two builds of the kernels run the same instructions: every kernel's SASS in the CUBINs
BEFORE against AFTER (comma-separated lists, from `bench/kernel_regs.py FILE --cubin OUT`), with
label numbers and the numbering of CUDA's internal helper functions left out (they change when a
kernel moves to another file and say nothing of what it runs). The check for a change that must not
change the kernels (moving a kernel between files, a header's reorganisation): no GPU needed.

For each kernel that differs it also says how: its instruction count before and after, and the
opcodes whose count changed the most (static counts: each instruction once, loops not weighted),
the first reading of what a change to a kernel bought when no GPU is at hand to time it.

Usage: bench/sass_diff.py BEFORE.cubin[,…] AFTER.cubin[,…]
Needs nvdisasm (the nvidia-cuda-nvdisasm wheel; found on the PATH, in $NVDISASM, or in an installed
wheel). Exits 1 when a kernel's SASS differs or a kernel is missing from one side.
"""
import collections
import glob
import os
import re
import shutil
import site
import subprocess
import sys


def nvdisasm():
    cands = [os.environ.get("NVDISASM"), shutil.which("nvdisasm")]
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        cands += glob.glob(os.path.join(sp, "nvidia", "cu*", "bin", "nvdisasm"))
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    sys.exit(f"{os.path.basename(sys.argv[0])}: no nvdisasm (pip install nvidia-cuda-nvdisasm, or set NVDISASM)")


def listing(tool, cubin):
    """`nvdisasm -c` of one CUBIN: every kernel's SASS, as text."""
    try:
        return subprocess.run([tool, "-c", cubin], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {cubin}: {getattr(e, 'stderr', '') or e}".strip())


def kernel_lines(text):
    """Kernel name -> the lines of its section in an nvdisasm listing (instructions and labels), in
    order (bench/load_waits.py reads them too)."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur:
            out[cur].append(line)
    return out


def kernels(tool, cubins):
    """Kernel name -> its instructions, normalised."""
    out = {}
    for path in cubins.split(","):
        for name, lines in kernel_lines(listing(tool, path)).items():
            ins = [re.sub(r"/\*[0-9a-f]{4,}\*/", "", l).strip() for l in lines if "/*" in l and ";" in l]
            # Runs of blanks collapsed: nvdisasm pads its trailing comments to the listing's widest
            # address, which moves when another kernel joins the CUBIN.
            ins = [re.sub(r"\s+", " ", re.sub(r"__internal_\d+_", "__internal_", re.sub(r"\.L_x_\d+", "L", i))) for i in ins]
            out[name] = ins
    return out


def opcode(instruction):
    """The opcode of a normalised instruction, without its predicate and modifiers: FMNMX of
    `@!P0 FMNMX.FTZ R1, R2, R3 ;`."""
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";").split(".")[0] if words else ""


def how_it_differs(before, after, most=8):
    """`N → M instructions; OPC a → b, …`: the opcodes whose static count moved, largest move first."""
    b, a = collections.Counter(map(opcode, before)), collections.Counter(map(opcode, after))
    moved = sorted((k for k in set(b) | set(a) if b[k] != a[k]), key=lambda k: (-abs(a[k] - b[k]), k))
    parts = [f"{k} {b[k]} → {a[k]}" for k in moved[:most]]
    more = f", {len(moved) - most} more" if len(moved) > most else ""
    return f"{len(before)} → {len(after)} instructions" + ("; " + ", ".join(parts) + more if parts else "")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench/sass_diff.py BEFORE.cubin[,…] AFTER.cubin[,…]")
    tool = nvdisasm()
    before, after = kernels(tool, sys.argv[1]), kernels(tool, sys.argv[2])
    differ = sorted(k for k in before if k in after and before[k] != after[k])
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    same = len(before) - len(differ) - len(gone)
    print(f"{same} of {len(before)} kernels run the same instructions")
    for name, ks in (("differ", differ), ("missing after", gone), ("new after", new)):
        if ks:
            print(f"{name}: {' '.join(ks)}")
    for k in differ:
        print(f"  {k}: {how_it_differs(before[k], after[k])}")
    sys.exit(1 if differ or gone else 0)


if __name__ == "__main__":
    main()
