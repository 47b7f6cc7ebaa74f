"""An independent numpy + ml_dtypes implementation of MXFP8 and NVFP4 as Transformer Engine defines
them, checked against what fp8-capture's CPU emulation wrote (tests/micro_reference.rs).

Usage: micro_reference.py DIR CASE... — each DIR/CASE holds meta.json, x.f32 and the Rust codes.u8,
scales.u8, deq.f32 (and for NVFP4 amax.f32: tensor amax, S_enc). Prints `CASE: ok` per case, or
the first disagreements and exits 1.

Element casts go through ml_dtypes (float8_e4m3fn, float8_e5m2, float4_e2m1fn after clipping to the
format's max: a saturating round-to-nearest-even cast); E8M0 scale values through float8_e8m0fnu.
Sources: Transformer Engine common/util/ptx_arch_spec.cuh (float_to_e8m0), common/util/ptx.cuh
(exp2f_rcp), common/cast/nvfp4/core_nvfp4.cuh, quantize_transpose_nvfp4.cuh, dequantize_nvfp4.cuh,
pytorch/custom_recipes/reference_nvfp4.py; OCP Microscaling Formats v1.0 §6.3.
"""

import json
import os
import sys

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
ELEM = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
MAX = {"e4m3": 448.0, "e5m2": 57344.0}
EMAX = {"e4m3": 8, "e5m2": 15}
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=np.float32)
E2M1_MAGS = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def blocks(rows, cols, tr, tc):
    """Block index of every element (row-major)."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    return (r // tr) * (-(-cols // tc)) + c // tc


def block_amax(x, bidx, n):
    a = np.where(np.isnan(x), F32(0), np.abs(x)).astype(np.float32)
    out = np.zeros(n, np.float32)
    np.maximum.at(out, bidx, a)
    return out


def sat_cast(y, fmt_max, dtype):
    """Saturating RNE cast: clip to ±max (NaN stays NaN), then ml_dtypes' round to nearest even."""
    return np.clip(y, -fmt_max, fmt_max).astype(dtype)


def e8m0_value(codes):
    return codes.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)


def mx_codes(amax, fmt, rounding):
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if rounding == "te":
            v = amax * (F32(1) / F32(MAX[fmt]))  # f32 multiply by TE's max_norm_rcp
            m, e = np.frexp(v.astype(np.float32))
            ceil_log2 = np.where(m == 0.5, e - 1, e)  # v = m·2^e, m in [0.5, 1)
            c = np.clip(ceil_log2 + 127, 0, 254)
            c = np.where(v == 0, 0, c)
            c = np.where(np.isinf(v), 254, c)
        else:
            m, e = np.frexp(amax)
            c = np.clip((e - 1) - EMAX[fmt] + 127, 0, 254)
            c = np.where(amax == 0, 0, c)
            c = np.where(np.isinf(amax), 254, c)
    return c.astype(np.uint8)


def check_mx(meta, x):
    fmt, rows, cols = meta["format"], meta["rows"], meta["cols"]
    tr, tc = meta["block"]
    b = blocks(rows, cols, tr, tc)
    n = b.max() + 1
    codes = mx_codes(block_amax(x, b, n), fmt, meta["rounding"])
    scale = e8m0_value(codes)  # 2^(c-127); ml_dtypes decodes code 0 as 2^-127
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mult = (F32(1) / scale).astype(np.float32)  # TE's exp2f_rcp, exact for every code
        y = (x * mult[b]).astype(np.float32)
        q = sat_cast(y, F32(MAX[fmt]), ELEM[fmt])
        deq = (q.astype(np.float32) * scale[b]).astype(np.float32)
    return codes, q.view(np.uint8), deq


def rht_rows(x, rows, cols):
    """RHT along the rows in runs of 16: signs, butterfly over strides 1, 2, 4, 8, then × 1/4."""
    t = x.reshape(rows, cols).copy()
    full = rows // 16 * 16
    v = t[:full].reshape(-1, 16, cols) * RHT_SIGNS[None, :, None]
    h = 1
    while h < 16:
        v = v.reshape(-1, 16 // (2 * h), 2, h, cols)
        a, bb = v[:, :, 0].copy(), v[:, :, 1].copy()
        v[:, :, 0], v[:, :, 1] = a + bb, a - bb
        v = v.reshape(-1, 16, cols)
        h *= 2
    t[:full] = (v * F32(0.25)).reshape(full, cols)
    return t.reshape(-1).astype(np.float32)


def splitmix_bits(seed, idx):
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (idx.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(32)).astype(np.uint32)


def e2m1_sr(y, seed):
    """Stochastic rounding: to the magnitude above with probability (|y| - lo) / (hi - lo)."""
    a = np.minimum(np.abs(np.nan_to_num(y, nan=0.0)), F32(6)).astype(np.float32)
    lo = np.searchsorted(E2M1_MAGS, a, side="right") - 1
    hi = np.minimum(lo + 1, 7)
    step = E2M1_MAGS[hi] - E2M1_MAGS[lo]
    p = np.where(step > 0, (a - E2M1_MAGS[lo]) / np.where(step > 0, step, 1), 0).astype(np.float32)
    r = splitmix_bits(seed, np.arange(y.size))
    up = r.astype(np.float64) < p.astype(np.float64) * 4294967296.0
    mag = E2M1_MAGS[np.where(up, hi, lo)]
    return np.where(np.signbit(y), -mag, mag).astype(np.float32)


def check_nv(meta, x):
    rows, cols = meta["rows"], meta["cols"]
    tr, tc = meta["block"]
    t = rht_rows(x, rows, cols) if meta["rht"] else x
    b = blocks(rows, cols, tr, tc)
    n = b.max() + 1
    bam = block_amax(t, b, n)
    amax = bam.max()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s_enc = min(F32(448 * 6) / amax, FLT_MAX)
        s_enc = F32(1) if (amax == 0 or s_enc == 0) else F32(s_enc)
        s_dec = F32(1) / s_enc
        sb = sat_cast(np.minimum(bam * (s_enc * (F32(1) / F32(6))), FLT_MAX), F32(448), ml_dtypes.float8_e4m3fn)
        sbf = sb.astype(np.float32)
        mult = np.minimum(F32(1) / (sbf * s_dec), FLT_MAX).astype(np.float32)
        y = (t * mult[b]).astype(np.float32)
        if meta["seed"] is None:
            vals = sat_cast(y, F32(6), ml_dtypes.float4_e2m1fn).astype(np.float32)
        else:
            vals = e2m1_sr(y, meta["seed"])
        final = (sbf * amax * (F32(1) / F32(6 * 448))).astype(np.float32)
        deq = (vals * final[b]).astype(np.float32)
        deq = np.where(np.isnan(t), F32(np.nan), deq)
    return sb.view(np.uint8), vals, deq, np.array([amax, s_enc], np.float32)


def same(a, b):
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def main():
    d, cases = sys.argv[1], sys.argv[2:]
    bad = 0
    for case in cases:
        p = os.path.join(d, case)
        meta = json.load(open(os.path.join(p, "meta.json")))
        x = np.fromfile(os.path.join(p, "x.f32"), dtype="<f4")
        codes = np.fromfile(os.path.join(p, "codes.u8"), dtype=np.uint8)
        scales = np.fromfile(os.path.join(p, "scales.u8"), dtype=np.uint8)
        deq = np.fromfile(os.path.join(p, "deq.f32"), dtype="<f4")
        errs = []
        if meta["kind"] == "mxfp8":
            s, q, want = check_mx(meta, x)
            nan = np.isnan(x)
            if not np.array_equal(s, scales):
                errs.append(f"scales differ at blocks {np.flatnonzero(s != scales)[:5]}: numpy {s[s != scales][:5]} rust {scales[s != scales][:5]}")
            qd = (q != codes) & ~nan
            if qd.any():
                i = np.flatnonzero(qd)[:5]
                errs.append(f"codes differ at {i}: x {x[i]} numpy {q[i]} rust {codes[i]}")
        else:
            s, vals, want, am = check_nv(meta, x)
            rust_am = np.fromfile(os.path.join(p, "amax.f32"), dtype="<f4")
            if not same(am, rust_am).all():
                errs.append(f"tensor amax / S_enc: numpy {am} rust {rust_am}")
            if not np.array_equal(s, scales):
                errs.append(f"block scales differ at {np.flatnonzero(s != scales)[:5]}")
            rust_vals = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], np.float32)[codes & 15]
            vd = ~same(vals, rust_vals) & ~np.isnan(x)
            if vd.any():
                i = np.flatnonzero(vd)[:5]
                errs.append(f"E2M1 values differ at {i}: numpy {vals[i]} rust {rust_vals[i]}")
        dd = ~same(want, deq)
        if dd.any():
            i = np.flatnonzero(dd)[:5]
            errs.append(f"dequantized differ at {i} ({dd.sum()} in all): numpy {want[i]} rust {deq[i]}")
        if errs:
            bad += 1
            print(f"{case}: FAIL\n  " + "\n  ".join(errs))
        else:
            print(f"{case}: ok ({x.size} elements, {scales.size} blocks)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
