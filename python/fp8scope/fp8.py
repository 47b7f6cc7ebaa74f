"""FP8 formats and exact casts in numpy: the same numbers as fp8-capture's `capture/src/fp8.rs`.

`encode` is a vectorised port of the Rust encoder, which is bit-identical to Hopper's
`cvt.rn.satfinite.{e4m3,e5m2}x2.f32`:

* round to nearest, ties to even;
* saturate: a finite value past the format's max, and ±Inf, give ±max;
* subnormals are produced (no flush to zero) and -0 stays -0 (0x80);
* every NaN gives 0x7F, whatever its sign and format.

Scaling follows Transformer Engine: the code of x is ``encode(x * scale)`` (an f32 multiply, then the
cast) and it stands for ``decode(code) / scale``. The tests compare this module with the Rust cast
bit for bit; `fp8scope.torch` casts the same way on the device (see `fp8scope/torch/cast.py`).

The formats' constants (max finite, smallest normal and subnormal, mantissa bits, bias, the codes of
the largest value, of Inf and of NaN) come from `_formats.json`, the quantization contract that the
Rust crate fp8scope-schemas exports (`fp8-capture formats --json`); nothing here restates them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

import numpy as np

#: The quantization contract (`schemas/src/quant.rs`), as exported to `_formats.json`.
CONTRACT = json.loads(resources.files("fp8scope").joinpath("_formats.json").read_text(encoding="utf-8"))
#: Its formats by name: e4m3, e5m2, e2m1, e8m0, each with max_finite, min_normal, min_subnormal,
#: mantissa_bits, bias, max_code, inf_code, nan_codes, ...
SPECS = {f["name"]: f for f in CONTRACT["formats"]}

#: The code every NaN input gets, in both formats (the H200's answer).
CANONICAL_NAN = 0x7F


@dataclass(frozen=True)
class Format:
    """Bit-level description of an FP8 format."""

    name: str
    mbits: int  # explicit mantissa bits
    bias: int
    max_code: int  # code (positive) of the largest finite value
    max_bits: int  # f32 bits of the largest finite value
    min_normal_bits: int  # f32 bits of the smallest normal value
    magic: float  # 2^(23 + log2(min_subnormal)): f32 ulp there is the smallest subnormal
    min_subnormal: float

    @property
    def max(self) -> float:
        return float(np.uint32(self.max_bits).view(np.float32))

    @property
    def min_normal(self) -> float:
        return float(np.uint32(self.min_normal_bits).view(np.float32))

    def is_nan_code(self, code: np.ndarray) -> np.ndarray:
        c = np.asarray(code, dtype=np.uint8) & 0x7F
        return np.isin(c, np.array(SPECS[self.name]["nan_codes"], dtype=np.uint8))

    def is_inf_code(self, code: np.ndarray) -> np.ndarray:
        c = np.asarray(code, dtype=np.uint8) & 0x7F
        inf = SPECS[self.name]["inf_code"]
        return np.zeros(c.shape, bool) if inf is None else c == inf


def _f32_bits(v: float) -> int:
    return int(np.float32(v).view(np.uint32))


def _from_contract(name: str) -> Format:
    f = SPECS[name]
    return Format(
        name=name,
        mbits=f["mantissa_bits"],
        bias=f["bias"],
        max_code=f["max_code"],
        max_bits=_f32_bits(f["max_finite"]),
        min_normal_bits=_f32_bits(f["min_normal"]),
        magic=f["min_subnormal"] * 2.0**23,
        min_subnormal=f["min_subnormal"],
    )


E4M3 = _from_contract("e4m3")
E5M2 = _from_contract("e5m2")
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}


def fmt(name: str | Format) -> Format:
    """The format named `e4m3` (also `e4m3fn`) or `e5m2`."""
    if isinstance(name, Format):
        return name
    key = name.strip().lower()
    key = "e4m3" if key == "e4m3fn" else key
    if key not in FORMATS:
        raise ValueError(f"unknown FP8 format '{name}' (e4m3 or e5m2)")
    return FORMATS[key]


def encode(f: str | Format, x) -> np.ndarray:
    """FP8 codes (uint8) of float32 values `x`: nearest even, saturating, subnormals kept."""
    p = fmt(f)
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    sign = (bits >> np.uint32(24)) & np.uint32(0x80)
    absb = bits & np.uint32(0x7FFF_FFFF)
    shift = np.uint32(23 - p.mbits)
    half_minus_one = np.uint32((1 << (23 - p.mbits - 1)) - 1)
    odd = (absb >> shift) & np.uint32(1)
    with np.errstate(over="ignore"):
        # uint32 arithmetic wraps like Rust's wrapping_sub; the result is only used where it is right.
        normal = ((absb + half_minus_one + odd) >> shift) - np.uint32((127 - p.bias) << p.mbits)
    magic = np.float32(p.magic)
    small = np.minimum(absb, np.uint32(p.min_normal_bits)).view(np.float32)
    with np.errstate(over="ignore"):
        sub = (small + magic).view(np.uint32) - magic.view(np.uint32)
    code = np.where(absb >= np.uint32(p.min_normal_bits), normal, sub)
    code = np.where(absb > np.uint32(p.max_bits), np.uint32(p.max_code), code)
    code = code | sign
    code = np.where(absb > np.uint32(0x7F80_0000), np.uint32(CANONICAL_NAN), code)
    return code.astype(np.uint8)


def _decode_table(p: Format) -> np.ndarray:
    codes = np.arange(256, dtype=np.uint32)
    sign = (codes >> 7) << 31
    mag = codes & 0x7F
    exp = mag >> p.mbits
    man = mag & ((1 << p.mbits) - 1)
    normal = (sign | ((exp + 127 - p.bias) << 23) | (man << (23 - p.mbits))).astype(np.uint32).view(np.float32)
    sub = man.astype(np.float32) * np.float32(p.min_subnormal)
    sub = np.where(sign != 0, -sub, sub).astype(np.float32)
    out = np.where(exp == 0, sub, normal).astype(np.float32)
    out = np.where(p.is_inf_code(codes.astype(np.uint8)), np.where(sign != 0, -np.inf, np.inf), out)
    out = np.where(p.is_nan_code(codes.astype(np.uint8)), np.nan, out)
    return out.astype(np.float32)


_TABLES = {name: _decode_table(p) for name, p in FORMATS.items()}


def decode(f: str | Format, codes) -> np.ndarray:
    """The exact float32 values of FP8 codes (NaN codes give NaN, E5M2's 0x7C/0xFC give ±Inf)."""
    return _TABLES[fmt(f).name][np.asarray(codes, dtype=np.uint8)]


def cast(f: str | Format, x, scale: float) -> np.ndarray:
    """Codes of `x` under `scale`: ``encode(x * scale)`` with the product rounded to float32."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return encode(f, x * np.float32(scale))


def dequantize(f: str | Format, codes, scale: float) -> np.ndarray:
    """The values codes stand for: ``decode(code) / scale`` (a float32 division)."""
    with np.errstate(invalid="ignore"):
        return decode(f, codes) / np.float32(scale)


def exp2i(e: int) -> np.float32:
    """2^e as float32, exact for e in -149..=127, 0 below and +Inf above."""
    if e > 127:
        return np.float32(np.inf)
    if e < -149:
        return np.float32(0.0)
    return np.float32(np.ldexp(np.float32(1.0), e))


def scale_for_amax(f: str | Format, amax: float, margin: int = 0) -> float:
    """Transformer Engine's scale ``(max / amax) / 2^margin`` in float32; 1.0 for an amax that is
    zero, negative or not finite; clamped into [f32 min normal, f32 max] as fp8-capture does."""
    a = np.float32(amax)
    if not (np.isfinite(a) and a > 0):
        return 1.0
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        s = (np.float32(fmt(f).max) / a) / exp2i(margin)
    if np.isnan(s):
        return float(np.finfo(np.float32).max)
    return float(np.clip(s, np.finfo(np.float32).tiny, np.finfo(np.float32).max))


def round_bf16(x) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even) and back; NaN stays NaN."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = (rounded & 0xFFFF_FFFF).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out).astype(np.float32)
