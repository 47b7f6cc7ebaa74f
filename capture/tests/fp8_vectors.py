#!/usr/bin/env python3
"""Writes FP8 reference vectors computed by ml_dtypes, for capture/tests/fp8_vs_ml_dtypes.rs.

Usage: fp8_vectors.py OUTDIR

For each format F in (e4m3, e5m2) it writes, little-endian:
  F_inputs.f32   every bf16 bit pattern (0x0000..0xFFFF) widened to f32, 65536 values, unclipped
  F_codes.u8     ml_dtypes' cast of clip(x, -max, max) to float8_e4m3fn / float8_e5m2.
                 ml_dtypes does not saturate (E4M3 overflows to NaN, E5M2 to Inf), so the clip
                 stands in for cvt.rn.satfinite; np.clip leaves NaN as NaN (and ml_dtypes then
                 keeps its sign).
  F_decode.f32   the 256 codes decoded to f32 by ml_dtypes
Exit status 3, with a one-line message, if numpy or ml_dtypes is missing.
"""

import os
import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:  # pragma: no cover - exercised only on a bare machine
    print(f"fp8_vectors.py: {e}; run `pip install ml_dtypes numpy`", file=sys.stderr)
    sys.exit(3)

FORMATS = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (ml_dtypes.float8_e5m2, 57344.0),
}


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: fp8_vectors.py OUTDIR", file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    bf16_bits = np.arange(65536, dtype=np.uint32) << np.uint32(16)
    x = bf16_bits.view(np.float32)
    for name, (dtype, fmax) in FORMATS.items():
        with np.errstate(invalid="ignore", over="ignore"):
            clipped = np.clip(x, np.float32(-fmax), np.float32(fmax))
            codes = clipped.astype(dtype).view(np.uint8)
        decoded = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
        x.astype("<f4").tofile(os.path.join(out, f"{name}_inputs.f32"))
        codes.astype(np.uint8).tofile(os.path.join(out, f"{name}_codes.u8"))
        decoded.astype("<f4").tofile(os.path.join(out, f"{name}_decode.f32"))
    print(f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
