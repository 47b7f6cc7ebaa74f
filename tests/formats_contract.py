"""The quantization contract's constants (python/fp8scope/_formats.json) against ml_dtypes, code by
code, and against what fp8scope.fp8 uses. Run by tests/formats_contract.rs; exits non-zero on the
first disagreement."""

import sys

import ml_dtypes
import numpy as np

from fp8scope import fp8

DTYPES = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
}


def fail(msg):
    print(msg)
    sys.exit(1)


for name, spec in fp8.SPECS.items():
    info = ml_dtypes.finfo(DTYPES[name])
    checks = {
        "max_finite": (spec["max_finite"], float(info.max)),
        "min_normal": (spec["min_normal"], float(info.smallest_normal)),
        "mantissa_bits": (spec["mantissa_bits"], int(info.nmant)),
        "bits": (spec["bits"], int(info.bits)),
    }
    if spec["min_subnormal"] is not None:
        checks["min_subnormal"] = (spec["min_subnormal"], float(info.smallest_subnormal))
    for key, (ours, theirs) in checks.items():
        if ours != theirs:
            fail(f"{name}.{key}: contract {ours}, ml_dtypes {theirs}")
    if name == "e2m1":
        # 4-bit codes: ml_dtypes stores one per byte, the sign in bit 3.
        vals = np.array([1, 2, 3, 4, 5, 6, 7], dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
        if vals[-1] != spec["max_finite"] or list(vals) != [.5, 1, 1.5, 2, 3, 4, 6]:
            fail(f"e2m1 codes 1..7 decode to {vals}")
        continue
    vals = np.arange(256, dtype=np.uint8).view(DTYPES[name]).astype(np.float64)
    if vals[spec["max_code"]] != spec["max_finite"]:
        fail(f"{name}: code {spec['max_code']:#x} is {vals[spec['max_code']]}, not max_finite")
    nan = [c for c in range(128) if np.isnan(vals[c])] if spec["signed"] else [c for c in range(256) if np.isnan(vals[c])]
    if nan != spec["nan_codes"]:
        fail(f"{name}: ml_dtypes NaN codes {nan}, contract {spec['nan_codes']}")
    inf = [c for c in range(128) if np.isinf(vals[c])]
    if inf != ([] if spec["inf_code"] is None else [spec["inf_code"]]):
        fail(f"{name}: ml_dtypes Inf codes {inf}, contract {spec['inf_code']}")
    finite = vals[np.isfinite(vals)]
    if finite.max() != spec["max_finite"]:
        fail(f"{name}: largest finite {finite.max()}")
    if name in fp8.FORMATS:
        f = fp8.FORMATS[name]
        if (f.max, f.min_normal, f.min_subnormal, f.mbits, f.bias, f.max_code) != (
            spec["max_finite"], spec["min_normal"], spec["min_subnormal"], spec["mantissa_bits"], spec["bias"], spec["max_code"]):
            fail(f"fp8scope.fp8.{name.upper()} differs from the contract")
        # fp8.decode on every code against ml_dtypes.
        ours = fp8.decode(name, np.arange(256, dtype=np.uint8)).astype(np.float64)
        same = (ours == vals) | (np.isnan(ours) & np.isnan(vals))
        if not same.all():
            fail(f"{name}: fp8.decode differs from ml_dtypes at codes {np.flatnonzero(~same)[:8]}")

print(f"{len(fp8.SPECS)} formats agree: contract, ml_dtypes and fp8scope.fp8")
