"""Raw statistic vectors computed on the device where the tensor lives (no host synchronisation):
the torch side of `fp8scope.stats.raw_stats`, with the same meanings, returned as one float64
vector per cast in the field order of `DEVICE_FIELDS[level]`. The host knows `numel` and derives
`inf` = numel − nan − n_finite, so neither is computed here.

`Kernels` runs these functions eagerly or through `torch.compile` (one fused reduction per call
instead of ~30 small kernels); the recorder picks with its `fused` argument.
"""

from __future__ import annotations

import types
import warnings

import torch

from ..session import AMAX, CHEAP, FULL
from .cast import DTYPES, HALF_MIN_SUBNORMAL, MAX

DEVICE_FIELDS = {
    AMAX: ("nan", "n_finite", "amax", "scale", "amax_used"),
    CHEAP: ("nan", "n_finite", "amax", "scale", "amax_used", "zeros", "min", "max", "min_abs_nonzero", "sum",
            "sumsq", "underflow", "saturated"),
}
DEVICE_FIELDS[FULL] = DEVICE_FIELDS[CHEAP] + ("q_n", "q_d2", "q_dot", "q_x2", "q_dq2")
#: The shadow vector on the device (the host adds numel): see `fp8scope.stats.SHADOW_RAW`.
SHADOW_DEVICE_FIELDS = ("nonfinite", "n", "d2", "dot", "t2", "r2", "max_abs")

_INF = float("inf")


def bf16_round(xf: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to bfloat16 (nearest even) and back, on the bits. Not
    ``x.to(torch.bfloat16).float()``: torch.compile (Inductor) removes that round trip as a no-op."""
    b = xf.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    r = (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16) & 0xFFFFFFFF
    r = torch.where(r >= 2**31, r - 2**32, r).to(torch.int32).view(torch.float32)
    return torch.where(torch.isnan(xf), xf, r)


def finite_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the finite values (0 when there are none), float32, 0-d."""
    a = x.detach().float().abs()
    return torch.where(a < _INF, a, 0.0).amax() if a.numel() else a.new_zeros(())


def current_scale(x: torch.Tensor, fmt: str, margin: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, amax) of current scaling: ``(max / amax) / 2^margin`` in float32, 1 when the amax is
    0, clamped into [f32 min normal, f32 max] — `fp8scope.fp8.scale_for_amax` on the device."""
    amax = finite_amax(x)
    tiny, big = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
    s = (torch.full_like(amax, MAX[fmt]) / amax) / torch.full_like(amax, 2.0**margin)
    s = torch.where(torch.isnan(s), torch.full_like(s, big), s).clamp(tiny, big)
    return torch.where(amax > 0, s, torch.ones_like(s)), amax


def operand_stats(x: torch.Tensor, fmt: str, scale: torch.Tensor, amax_used: torch.Tensor, level: int) -> torch.Tensor:
    """The device raw vector of casting `x` as `fmt` (`e4m3`, `e5m2` or `bf16`) with `scale`."""
    xf = x.detach().reshape(-1).float()
    a = xf.abs()
    fin = a < _INF  # NaN compares false
    af = torch.where(fin, a, 0.0)
    out = [torch.isnan(xf).sum(), fin.sum(), af.amax(), scale.float(), amax_used.float()]
    if level >= CHEAP:
        xz = torch.where(fin, xf, 0.0).double()
        nonzero = fin & (a > 0)
        if fmt == "bf16":
            r = bf16_round(xf)
            under = (nonzero & (r == 0)).sum()
            sat = (fin & torch.isinf(r)).sum()
        else:
            ay = (xf * scale).abs()
            under = (nonzero & (ay <= HALF_MIN_SUBNORMAL[fmt])).sum()
            sat = (ay > MAX[fmt]).sum()  # ±Inf inputs included, as fp8-capture counts them
        out += [(a == 0).sum(), torch.where(fin, xf, _INF).amin(), torch.where(fin, xf, -_INF).amax(),
                torch.where(af > 0, af, _INF).amin(), xz.sum(), (xz * xz).sum(), under, sat]
    if level >= FULL:
        if fmt == "bf16":
            dq = bf16_round(xf)
        else:
            m = MAX[fmt]
            dq = (xf * scale).clamp(-m, m).to(DTYPES[fmt]).float() / scale
        both = fin & torch.isfinite(dq)
        e = torch.where(both, xf, 0.0).double()
        d = torch.where(both, dq, 0.0).double()
        out += [both.sum(), ((d - e) ** 2).sum(), (d * e).sum(), (e * e).sum(), (d * d).sum()]
    return torch.stack([v.double() for v in out])


def nonfinite_count(y: torch.Tensor) -> torch.Tensor:
    """Number of NaN and ±Inf values of `y`, as a 1-element float64 vector."""
    return (~torch.isfinite(y.detach())).sum().double().reshape(1)


def shadow_stats(test: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """The device shadow vector of a GEMM output against its BF16 reference, over finite pairs."""
    t, r = test.reshape(-1).float(), reference.reshape(-1).float()
    both = torch.isfinite(t) & torch.isfinite(r)
    td, rd = torch.where(both, t, 0.0).double(), torch.where(both, r, 0.0).double()
    d = td - rd
    out = [(~torch.isfinite(t)).sum(), both.sum(), (d * d).sum(), (td * rd).sum(), (td * td).sum(), (rd * rd).sum(),
           d.abs().amax() if d.numel() else d.new_zeros(())]
    return torch.stack([v.double() for v in out])


def _no_duck_shapes():
    """Symbolic sizes that do not assume equal sizes are one size (a chunk's operands of equal shape
    would otherwise be guarded equal, and another chunk would recompile)."""
    try:
        from torch.fx.experimental import _config

        return _config.patch(use_duck_shape=False)
    except (ImportError, AttributeError):  # pragma: no cover - older torch
        import contextlib

        return contextlib.nullcontext()


def _own_code(fn, key: tuple):
    """`fn` with a code object of its own: dynamo keeps one cache (and one recompile limit) per code
    object, and the closures of `Kernels` share theirs."""
    name = "_".join(str(k) for k in key)
    return types.FunctionType(fn.__code__.replace(co_name=name), fn.__globals__, name, fn.__defaults__, fn.__closure__)


class Kernels:
    """The statistic functions, compiled with torch.compile when `fused` (True, or "auto" on CUDA),
    else eager. Each (function, format, level) is its own compiled function, so that the constants
    do not count against dynamo's recompile limit; only the input's dtype makes variants. A compile
    that fails falls back to eager for good, with a warning."""

    def __init__(self, fused, device_type: str):
        self.fused = (device_type == "cuda") if fused == "auto" else bool(fused)
        self._cache: dict[tuple, object] = {}

    def _call(self, key: tuple, eager, *args):
        f = self._cache.get(key)
        if f is None:
            f = self._cache[key] = torch.compile(_own_code(eager, key), dynamic=True) if self.fused else eager
        if not self.fused:
            return f(*args)
        try:
            return f(*args)
        except Exception as e:  # noqa: BLE001 - any compile failure: fall back, keep recording
            warnings.warn(f"fp8scope: torch.compile of the statistics failed ({type(e).__name__}: {e}); "
                          "computing them eagerly", RuntimeWarning, stacklevel=3)
            self.fused = False
            self._cache.clear()
            return eager(*args)

    def operand(self, x, fmt: str, scale, amax_used, level: int) -> torch.Tensor:
        def stats(x, scale, amax_used):
            return operand_stats(x, fmt, scale, amax_used, level)
        return self._call(("operand", fmt, level), stats, x, scale, amax_used)

    def many(self, xs, fmt: str, level: int, kind: str, margin: int, buf, idx) -> torch.Tensor:
        """The raw vectors of many operands, (n, fields) float64: `fp8scope.torch.batch.batch_fn`,
        eagerly, or when fused one compiled function of `batch.CHUNK` operands called per chunk (the
        last padded with 2x2 zeros), its shapes dynamic and not duck-shaped, so that every chunk of
        every step reuses one compiled program per (format, level, recipe kind)."""
        from .batch import CHUNK, batch_fn

        eager = batch_fn(fmt, level, kind, margin)
        if not self.fused:
            return eager(xs, buf, idx)
        out = []
        for c in range(0, len(xs), CHUNK):
            part, ix = list(xs[c: c + CHUNK]), list(idx[c: c + CHUNK])
            n = len(part)
            if n < CHUNK:
                pad = part[0].new_zeros(2, 2)
                part += [pad] * (CHUNK - n)
                ix += [ix[0]] * (CHUNK - n)
            with _no_duck_shapes():
                got = self._call(("many", fmt, level, kind, margin), eager, part, buf, ix)
            out.append(got[:n])
        return out[0] if len(out) == 1 else torch.cat(out)

    def nonfinite_many(self, ys) -> torch.Tensor:
        """`nonfinite_count` of many tensors, (n, 1) float64; compiled per chunk like `many`."""
        from .batch import CHUNK

        def counts(ys):
            return torch.stack([nonfinite_count(y) for y in ys])
        if not self.fused:
            return counts(ys)
        out = []
        for c in range(0, len(ys), CHUNK):
            part = list(ys[c: c + CHUNK])
            n = len(part)
            part += [part[0].new_zeros(2, 2)] * (CHUNK - n)
            with _no_duck_shapes():
                out.append(self._call(("nonfinite",), counts, part)[:n])
        return out[0] if len(out) == 1 else torch.cat(out)

    def current(self, x, fmt: str, margin: int):
        def scale(x):
            return current_scale(x, fmt, margin)
        return self._call(("current", fmt, margin), scale, x)
