"""Independent check of `fp8-analyze compare`: the same metrics computed with pyarrow + numpy.

Reads the tensors tables of two runs (every `tensors/part-*.parquet`), joins their rows on
(step, layer, module, role, offset) with a dict (not the analyzer's side-by-side walk), adds the
chunks of each (step, layer, module, role) together in float64, and prints one JSON object per
tensor: cosine, mse, rel_l2, sqnr_db (null when infinite), max_abs_diff, numel.

usage: python3 compare_check.py RUN_DIR BASELINE_DIR
"""
import glob
import json
import math
import os
import sys

try:
    import numpy as np
    import pyarrow.parquet as pq
except ImportError as e:  # the Rust test turns this into its failure message
    print(f"missing Python module ({e.name}): pip install pyarrow numpy", file=sys.stderr)
    sys.exit(3)

COLUMNS = ["step", "layer", "module", "role", "offset", "values"]


def rows(run_dir):
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "tensors", "part-*.parquet"))):
        t = pq.read_table(path, columns=COLUMNS)
        cols = {c: t.column(c).to_pylist() for c in COLUMNS[:-1]}
        values = t.column("values")
        for i in range(t.num_rows):
            key = tuple(cols[c][i] for c in COLUMNS[:-1])
            out[key] = np.asarray(values[i].values.to_numpy(zero_copy_only=False), dtype=np.float64)
    return out


def main():
    run, base = rows(sys.argv[1]), rows(sys.argv[2])
    groups = {}
    for key in sorted(set(run) & set(base)):
        step, layer, module, role, _offset = key
        a, b = groups.setdefault((step, layer, module, role), ([], []))
        a.append(run[key])
        b.append(base[key])
    result = []
    for (step, layer, module, role), (a, b) in sorted(groups.items()):
        a, b = np.concatenate(a), np.concatenate(b)
        d = a - b
        aa, bb, dd = float(a @ a), float(b @ b), float(d @ d)
        if dd == 0:
            cosine = 1.0
        elif aa == 0 or bb == 0:
            cosine = 0.0
        else:
            cosine = max(-1.0, min(1.0, float(a @ b) / (math.sqrt(aa) * math.sqrt(bb))))
        result.append({
            "step": step, "layer": layer, "module": module, "role": role, "numel": int(a.size),
            "cosine": cosine,
            "mse": dd / a.size,
            "rel_l2": 0.0 if dd == 0 else (math.inf if bb == 0 else math.sqrt(dd) / math.sqrt(bb)),
            "sqnr_db": None if dd == 0 else 10 * math.log10(bb / dd),
            "max_abs_diff": float(np.max(np.abs(d))) if d.size else 0.0,
        })
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
