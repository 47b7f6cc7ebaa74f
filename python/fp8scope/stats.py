"""Statistics of one cast operand, as fp8-capture records them (capture/src/backend/cpu/cast.rs,
capture/src/tensor_stats.rs, capture/src/record/rows.rs), in two steps:

1. a *raw vector* of sums, counts and extremes (`RAW`), computed where the tensor lives — by
   `raw_stats` here in numpy (the reference), by `fp8scope.torch.stats` on the device;
2. on the host, raw vectors of the same operand within a step are merged (`merge`: counts and sums
   add, extremes reduce) and turned into a `stats` row (`stat_row`).

Meanings (schemas/README.md): underflow counts finite non-zero values whose code is ±0 (over the
finite non-zero values); saturated counts values with |x·scale| > max, ±Inf inputs included (over
all values); min, max, mean, std and the dynamic range cover the finite values; quant_mse and
quant_cos compare x with dequant(cast(x)) over the pairs where both are finite.
"""

from __future__ import annotations

import math

import numpy as np

from . import fp8

#: The raw vector, in order. `q_*` are NaN when the quantization error was not computed.
RAW = ("numel", "nan", "inf", "zeros", "n_finite", "amax", "min", "max", "min_abs_nonzero", "sum", "sumsq",
       "underflow", "saturated", "scale", "amax_used", "q_n", "q_d2", "q_dot", "q_x2", "q_dq2")
IX = {name: i for i, name in enumerate(RAW)}
_SUMS = [IX[n] for n in ("numel", "nan", "inf", "zeros", "n_finite", "sum", "sumsq", "underflow", "saturated",
                         "q_n", "q_d2", "q_dot", "q_x2", "q_dq2")]
_MAXS = [IX[n] for n in ("amax", "max")]
_MINS = [IX[n] for n in ("min", "min_abs_nonzero")]

#: The raw vector of a shadow GEMM (fp8 output `t` against the BF16 reference `r`, finite pairs).
SHADOW_RAW = ("numel", "nonfinite", "n", "d2", "dot", "t2", "r2", "max_abs")


def quantize(fmt_name: str, x: np.ndarray, scale: float) -> tuple[np.ndarray | None, np.ndarray]:
    """(codes, dequantized) of `x` under the recipe's cast: FP8 codes and decode(code)/scale, or, for
    `bf16`, no codes and x rounded to BF16."""
    x = np.asarray(x, dtype=np.float32)
    if fmt_name == "bf16":
        return None, fp8.round_bf16(x)
    codes = fp8.cast(fmt_name, x, scale)
    return codes, fp8.dequantize(fmt_name, codes, scale)


def raw_stats(x, fmt_name: str, scale: float, amax_used: float, quant_error: bool) -> np.ndarray:
    """The raw vector of one cast of `x` (the reference the device implementation is tested against)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    a = np.abs(x)
    finite = np.isfinite(x)
    xf = x[finite].astype(np.float64)
    af = np.abs(xf)
    nz = af[af > 0]
    codes, dq = quantize(fmt_name, x, scale)
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt_name == "bf16":
            underflow = np.count_nonzero(finite & (x != 0) & (dq == 0))
            saturated = np.count_nonzero(finite & np.isinf(dq))
        else:
            underflow = np.count_nonzero(finite & (x != 0) & ((codes & 0x7F) == 0))
            saturated = np.count_nonzero(np.abs(x * np.float32(scale)) > fp8.fmt(fmt_name).max)
    v = np.full(len(RAW), np.nan)
    v[IX["numel"]] = x.size
    v[IX["nan"]] = np.count_nonzero(np.isnan(x))
    v[IX["inf"]] = np.count_nonzero(np.isinf(x))
    v[IX["zeros"]] = np.count_nonzero(a == 0)
    v[IX["n_finite"]] = xf.size
    v[IX["amax"]] = af.max() if af.size else 0.0
    v[IX["min"]] = xf.min() if xf.size else np.inf
    v[IX["max"]] = xf.max() if xf.size else -np.inf
    v[IX["min_abs_nonzero"]] = nz.min() if nz.size else np.inf
    v[IX["sum"]] = xf.sum()
    v[IX["sumsq"]] = (xf * xf).sum()
    v[IX["underflow"]] = underflow
    v[IX["saturated"]] = saturated
    v[IX["scale"]] = np.float32(scale)
    v[IX["amax_used"]] = np.float32(amax_used)
    if quant_error:
        both = finite & np.isfinite(dq)
        e, d = x[both].astype(np.float64), dq[both].astype(np.float64)
        v[IX["q_n"]] = e.size
        v[IX["q_d2"]] = ((d - e) ** 2).sum()
        v[IX["q_dot"]] = (d * e).sum()
        v[IX["q_x2"]] = (e * e).sum()
        v[IX["q_dq2"]] = (d * d).sum()
    return v


def merge(raws: list[np.ndarray]) -> np.ndarray:
    """One raw vector from those of several casts of the same operand within a step (a module that
    ran more than once): counts and sums add, extremes reduce; scale and amax_used are the first's."""
    if len(raws) == 1:
        return raws[0]
    m = np.stack(raws)
    out = m[0].copy()
    out[_SUMS] = m[:, _SUMS].sum(axis=0)
    out[_MAXS] = m[:, _MAXS].max(axis=0)
    out[_MINS] = m[:, _MINS].min(axis=0)
    return out


def cosine_from(dot: float, na2: float, nb2: float) -> float:
    """Cosine similarity; 1 when both vectors are zero, 0 when exactly one is."""
    if na2 == 0.0 and nb2 == 0.0:
        return 1.0
    if na2 == 0.0 or nb2 == 0.0:
        return 0.0
    return dot / (math.sqrt(na2) * math.sqrt(nb2))


def _frac(count: float, of: float) -> float:
    return 0.0 if of == 0 else float(count) / float(of)


def stat_row(step: int, layer: int, module: str, gemm: str, role: str, fmt_name: str, v: np.ndarray) -> dict:
    """A `stats` row from a (merged) raw vector."""
    g = lambda name: float(v[IX[name]])  # noqa: E731
    numel, n = g("numel"), g("n_finite")
    nonzero = numel - g("zeros") - g("nan") - g("inf")
    if n > 0:
        mean = g("sum") / n
        std = math.sqrt(max(g("sumsq") / n - mean * mean, 0.0))
        lo, hi = g("min"), g("max")
        amax, mnz = g("amax"), g("min_abs_nonzero")
        dyn = math.log2(amax / mnz) if amax > 0 and math.isfinite(mnz) else 0.0
    else:
        mean = std = lo = hi = dyn = 0.0
    row = {
        "step": step, "layer": layer, "module": module, "gemm": gemm, "role": role, "format": fmt_name,
        "scale": g("scale"), "amax": g("amax"), "amax_used": g("amax_used"), "numel": int(numel),
        "underflow_frac": _frac(g("underflow"), nonzero), "saturated_frac": _frac(g("saturated"), numel),
        "nan_count": int(g("nan")), "inf_count": int(g("inf")), "zero_frac": _frac(g("zeros"), numel),
        "min": lo, "max": hi, "mean": mean, "std": std, "dynamic_range_log2": dyn,
        "quant_mse": None, "quant_cos": None, "quant_bias": None,
        "flip_frac": None, "flip_ratio": None,
    }
    if not math.isnan(g("q_n")):
        qn = g("q_n")
        row["quant_mse"] = 0.0 if qn == 0 else g("q_d2") / qn
        row["quant_cos"] = cosine_from(g("q_dot"), g("q_dq2"), g("q_x2"))
        row["quant_bias"] = 0.0 if g("q_x2") == 0 else g("q_dot") / g("q_x2") - 1.0
    return row


def shadow_raw(test, reference) -> np.ndarray:
    """The shadow raw vector of an FP8 GEMM output against its BF16 reference (numpy reference)."""
    t = np.asarray(test, dtype=np.float32).reshape(-1)
    r = np.asarray(reference, dtype=np.float32).reshape(-1)
    both = np.isfinite(t) & np.isfinite(r)
    tt, rr = t[both].astype(np.float64), r[both].astype(np.float64)
    d = tt - rr
    return np.array([t.size, np.count_nonzero(~np.isfinite(t)), tt.size, (d * d).sum(), (tt * rr).sum(),
                     (tt * tt).sum(), (rr * rr).sum(), np.abs(d).max() if d.size else 0.0])


def shadow_row(step: int, layer: int, module: str, gemm: str, v) -> dict:
    """A `shadow` row: (cosine, MSE, relative L2, max |t−r|); every metric NaN when the FP8 output
    holds a non-finite value (an error must not hide them), as fp8-capture does."""
    numel, nonfinite, n, d2, dot, t2, r2, max_abs = (float(x) for x in v)
    if nonfinite > 0:
        cos = mse = rel = max_abs = math.nan
    else:
        mse = 0.0 if n == 0 else d2 / n
        rel = (0.0 if d2 == 0 else math.inf) if r2 == 0 else math.sqrt(d2 / r2)
        cos = cosine_from(dot, t2, r2)
    return {"step": step, "layer": layer, "module": module, "gemm": gemm, "numel": int(numel),
            "cosine": cos, "mse": mse, "rel_l2": rel, "max_abs_diff": max_abs}


def dump_window(rows: int, cols: int, max_elems: int, strided: bool) -> tuple[int, int, int]:
    """Which elements a dump takes, as (offset, len, stride) — fp8-capture's `dump_window`: leading
    whole rows (or the first `max_elems` of the first row if a row is longer), or `max_elems` spread
    evenly."""
    numel = rows * cols
    mx = max(max_elems, 1)
    if numel <= mx:
        return 0, numel, 1
    if strided:
        stride = -(-numel // mx)
        return 0, -(-numel // stride), stride
    if cols <= mx:
        return 0, (mx // cols) * cols, 1
    return 0, mx, 1


def layer_of(module: str) -> int:
    """The contract's `layer` of a module path: its first integer component, 0 when there is none."""
    for part in module.split("."):
        if part.isdigit():
            return int(part)
    return 0
