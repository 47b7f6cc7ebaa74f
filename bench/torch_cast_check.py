"""Checks fp8scope's torch side against its numpy reference, on the GPU (and on the CPU):

1. the FP8 cast `fp8scope.torch.cast_fp8` against `fp8scope.fp8.cast` (itself bit-identical to
   fp8-capture's cast, tested in CI) on ~2.1 M values: every FP8 code, its neighbours and the
   midpoints between codes, f32 specials, and a sweep over all 2^32 bit patterns — unscaled and
   with a scale; byte for byte;
2. the device statistics as the recorder runs them (`fp8scope.torch.stats.Kernels`, eager and
   torch.compile'd) against
   `fp8scope.stats.raw_stats` on tensors with zeros, underflow, saturation, NaN and Inf, in float32
   and bfloat16, for e4m3, e5m2 and bf16 casts and every statistics level: counts exactly, sums to
   1e-9 relative;
3. the current-scaling scale on the device against `fp8scope.fp8.scale_for_amax`, exactly.

Usage: python3 bench/torch_cast_check.py [--device cuda] [--no-compile]
Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from fp8scope import fp8, stats as st  # noqa: E402
from fp8scope.session import AMAX, CHEAP, FULL  # noqa: E402
from fp8scope.torch.cast import cast_fp8  # noqa: E402
from fp8scope.torch.stats import DEVICE_FIELDS, Kernels  # noqa: E402

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{(': ' + detail) if detail else ''}", flush=True)


def cast_values():
    v = [np.float32(x) for x in (0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(np.float32).max, np.finfo(np.float32).tiny)]
    parts = [np.array(v, np.float32)]
    for name in ("e4m3", "e5m2"):
        d = fp8.decode(name, np.arange(256, dtype=np.uint8))
        d = np.unique(d[np.isfinite(d) & (d >= 0)]).astype(np.float32)
        mids = ((d[:-1].astype(np.float64) + d[1:]) / 2).astype(np.float32)
        for x in (d, mids):
            b = x.view(np.uint32)
            parts += [x, (b + 1).view(np.float32), (np.maximum(b, 1) - 1).view(np.float32)]
    parts.append(np.arange(0, 2**32, 4093, dtype=np.uint64).astype(np.uint32).view(np.float32))
    x = np.concatenate(parts)
    return np.concatenate([x, -x])


def planted(n, dtype, rng):
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-12, 8, n))).astype(np.float32)
    x[:50] = 0
    x[50:60] = 1e-30
    x[60:70] = 1e6
    x[70], x[71], x[72] = np.nan, np.inf, -np.inf
    x[73], x[74] = 1e-41, -3.4e38  # BF16 rounds them to 0 and -Inf
    if dtype == torch.bfloat16:
        x = fp8.round_bf16(x)
    return x


def compare_raw(name, got, want, fields):
    idx = [st.IX[f] for f in fields]
    w = want[idx]
    bad = []
    for f, g, e in zip(fields, got, w):
        if f in ("sum", "sumsq", "q_d2", "q_dot", "q_x2", "q_dq2"):
            ok = abs(g - e) <= 1e-9 * max(abs(e), 1e-300) or g == e
        else:
            ok = (g == e) or (np.isnan(g) and np.isnan(e))
        if not ok:
            bad.append(f"{f} {g!r} vs {e!r}")
    check(name, not bad, "; ".join(bad[:4]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    dev = torch.device(a.device)
    print(f"torch {torch.__version__} on {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'})")

    x = cast_values()
    xt = torch.from_numpy(x).to(dev)
    for name in ("e4m3", "e5m2"):
        for scale in (1.0, fp8.scale_for_amax(name, 3.7)):
            want = fp8.cast(name, x, scale)
            s = torch.tensor(scale, dtype=torch.float32, device=dev)
            got = cast_fp8(xt, name, s).cpu().numpy()
            bad = np.flatnonzero(got != want)
            check(f"cast {name} scale {scale:g} on {x.size} values", bad.size == 0,
                  f"{bad.size} differ, e.g. x={x[bad[:3]]} torch={got[bad[:3]]} numpy={want[bad[:3]]}" if bad.size else "")

    rng = np.random.default_rng(0)
    kernels = [("eager", Kernels(False, dev.type))] + ([] if a.no_compile else [("compiled", Kernels(True, dev.type))])
    for label, k in kernels:
        for dtype in (torch.float32, torch.bfloat16):
            for n in (4096, 1_000_003):
                xn = planted(n, dtype, rng)
                t = torch.from_numpy(xn).to(dev).to(dtype)
                for fmt_name in ("e4m3", "e5m2"):
                    s, amax = k.current(t, fmt_name, 1)
                    want_s = fp8.scale_for_amax(fmt_name, float(np.max(np.abs(xn[np.isfinite(xn)]))), 1)
                    check(f"{label} current scale {fmt_name} {dtype} n={n}", float(s) == want_s, f"{float(s)!r} vs {want_s!r}")
                for fmt_name, scale in (("e4m3", 2.0**-3), ("e5m2", 2.0**10), ("bf16", 1.0)):
                    for level in (AMAX, CHEAP, FULL):
                        sc = torch.tensor(scale, dtype=torch.float32, device=dev)
                        got = k.operand(t, fmt_name, sc, sc, level).cpu().numpy()
                        want = st.raw_stats(xn, fmt_name, scale, scale, level == FULL)
                        compare_raw(f"{label} stats {fmt_name} {dtype} n={n} level={level}", got, want,
                                    DEVICE_FIELDS[level])
        if label == "compiled":
            check("the statistics ran compiled (no fallback to eager)", k.fused)
    passed = sum(RESULTS)
    print(f"{passed} passed, {len(RESULTS) - passed} failed")
    sys.exit(0 if passed == len(RESULTS) else 1)


if __name__ == "__main__":
    main()
