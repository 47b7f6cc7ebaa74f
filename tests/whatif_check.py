"""An independent numpy + ml_dtypes computation of `fp8-analyze whatif`, checked against its JSON
(tests/whatif.rs).

Usage: whatif_check.py RUN WHATIF_JSON — recomputes, from RUN's tensors table, every row of the
JSON: the dequantized cast of each format (per-tensor E4M3 / E5M2 with current scaling; MXFP8 and
NVFP4 through tests/micro_reference.py's implementations; DeepSeek-style block scaling), then the
underflow and saturation shares, MSE, cosine and SQNR. Prints `OK n rows` or the first
disagreements and exits 1.
"""

import glob
import json
import math
import os
import sys

import ml_dtypes
import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import micro_reference as mr  # noqa: E402

F32 = np.float32
ELEM = {"e4m3": (ml_dtypes.float8_e4m3fn, F32(448.0)), "e5m2": (ml_dtypes.float8_e5m2, F32(57344.0))}


def per_tensor_scale(amax, fmt_max):
    """fp8::scale_for_amax with margin 0: max / amax in f32, 1 for a zero or non-finite amax."""
    if not (np.isfinite(amax) and amax > 0):
        return F32(1)
    return F32(np.clip(F32(fmt_max) / F32(amax), np.finfo(np.float32).tiny, np.finfo(np.float32).max))


def cast_scaled(x, scale, fmt):
    """(scaled values y, dequantized values): saturating RNE cast of x·scale, decoded / scale."""
    dtype, fmt_max = ELEM[fmt]
    with np.errstate(over="ignore", invalid="ignore"):
        y = (x * scale).astype(np.float32)
        q = mr.sat_cast(y, fmt_max, dtype).astype(np.float32)
        return y, (q / scale).astype(np.float32)


def dequantized(fmt, role, x, rows, cols):
    """(scaled values, the format's max, dequantized values) of x (rows × cols) under fmt."""
    weight = role == "weight"
    if fmt in ("e4m3", "e5m2"):
        finite = x[np.isfinite(x)]
        amax = F32(np.abs(finite).max()) if finite.size else F32(0)
        y, deq = cast_scaled(x, per_tensor_scale(amax, ELEM[fmt][1]), fmt)
        return y, ELEM[fmt][1], deq
    if fmt == "mxfp8":
        _, _, deq = mr.check_mx({"format": "e4m3", "rows": rows, "cols": cols, "block": [1, 32], "rounding": "te"}, x)
        return None, None, deq
    if fmt == "nvfp4":
        _, _, deq, _ = mr.check_nv({"rows": rows, "cols": cols, "block": [16 if weight else 1, 16], "rht": False, "seed": None}, x)
        return None, None, deq
    if fmt == "block":
        tr, tc = (128 if weight else 1), 128
        b = mr.blocks(rows, cols, tr, tc)
        bam = mr.block_amax(x, b, b.max() + 1)
        scales = np.array([per_tensor_scale(a, 448.0) for a in bam], dtype=np.float32)
        y, deq = cast_scaled(x, scales[b], "e4m3")
        return y, F32(448.0), deq
    raise SystemExit(f"unknown format {fmt}")


def metrics(x, y, fmt_max, deq):
    ok = np.isfinite(x) & np.isfinite(deq)
    a, d = x[ok].astype(np.float64), deq[ok].astype(np.float64)
    mse = float(((d - a) ** 2).mean()) if a.size else 0.0
    na, nd = float((a * a).sum()), float((d * d).sum())
    cos = 1.0 if na == 0 and nd == 0 else (0.0 if na == 0 or nd == 0 else float((a * d).sum()) / math.sqrt(na * nd))
    nonzero = np.isfinite(x) & (x != 0)
    underflow = float((nonzero & (deq == 0)).sum()) / max(int(nonzero.sum()), 1)
    saturated = None if y is None else float((np.abs(np.nan_to_num(y, nan=0.0)) > fmt_max).sum()) / x.size
    fin = x[np.isfinite(x)].astype(np.float64)
    mean_sq = float((fin * fin).mean()) if fin.size else 0.0
    sqnr = 10 * math.log10(mean_sq / mse) if mse > 0 and mean_sq > 0 else None
    return mse, cos, underflow, saturated, sqnr


def close(a, b, rel=1e-9, abs_=1e-12):
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= abs_ + rel * abs(b))


def main():
    run, report = sys.argv[1], json.load(open(sys.argv[2]))
    files = glob.glob(os.path.join(run, "tensors", "**", "*.parquet"), recursive=True)
    dumps = {}
    for r in pq.read_table(files).to_pylist():
        dumps[(r["step"], r["layer"], r["module"], r["role"], r["offset"])] = r
    bad = []
    for row in report["rows"]:
        d = dumps[(row["step"], row["layer"], row["module"], row["role"], 0)]
        x = np.array(d["values"], dtype=np.float32)
        rows, cols = row["rows"], row["cols"]
        if rows * cols != x.size or row["tensor_rows"] != d["shape"][0] or row["whole"] != (d["numel"] == x.size):
            bad.append(f"{row}: shape {d['shape']}, {x.size} values dumped")
            continue
        y, fmt_max, deq = dequantized(row["format"], row["role"], x, rows, cols)
        mse, cos, under, sat, sqnr = metrics(x, y, fmt_max, deq)
        want = {"mse": mse, "cosine": cos, "underflow_frac": under, "sqnr_db": sqnr}
        if sat is not None:
            want["saturated_frac"] = sat
        for k, v in want.items():
            if not close(row[k], v):
                bad.append(f"step {row['step']} layers.{row['layer']}.{row['module']}.{row['role']} {row['format']}: {k} {row[k]!r}, numpy {v!r}")
    if bad:
        print("\n".join(bad[:20]))
        sys.exit(1)
    print(f"OK {len(report['rows'])} rows")


if __name__ == "__main__":
    main()
