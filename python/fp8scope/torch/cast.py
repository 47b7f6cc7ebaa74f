"""FP8 casts in torch, bit-identical to fp8-capture's (`capture/src/fp8.rs`) and to `fp8scope.fp8`.

torch's own `x.to(torch.float8_e4m3fn)` rounds to nearest even and keeps subnormals but does not
saturate: a value past max becomes NaN (E4M3) or Inf (E5M2), and a NaN keeps its sign. fp8scope's
cast is Hopper's `cvt.rn.satfinite`: values are clamped to ±max before the conversion (±Inf too),
and every NaN gives the code 0x7F. bench/torch_cast_check.py checks this against the numpy cast on a
GPU, value set by value set.
"""

from __future__ import annotations

import torch

from .. import fp8 as _np_fp8

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
MAX = {name: _np_fp8.fmt(name).max for name in DTYPES}
#: |x·scale| at or below this casts to ±0 (half the smallest subnormal; the tie rounds to even, 0).
HALF_MIN_SUBNORMAL = {name: _np_fp8.fmt(name).min_subnormal / 2 for name in DTYPES}


def cast_fp8(x: torch.Tensor, fmt: str, scale) -> torch.Tensor:
    """FP8 codes (uint8) of ``x * scale`` (an f32 multiply): nearest even, saturating, NaN → 0x7F.
    `scale` is a float or a 0-d float32 tensor on x's device."""
    y = x.float() * scale
    m = MAX[fmt]
    codes = y.clamp(-m, m).to(DTYPES[fmt]).view(torch.uint8)
    return torch.where(torch.isnan(y), torch.full_like(codes, _np_fp8.CANONICAL_NAN), codes)


def dequantize_fp8(codes: torch.Tensor, fmt: str, scale) -> torch.Tensor:
    """The float32 values codes stand for: ``decode(code) / scale``."""
    return codes.view(DTYPES[fmt]).float() / scale


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to bfloat16 (nearest even) and back to float32."""
    return x.float().to(torch.bfloat16).float()
