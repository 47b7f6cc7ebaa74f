"""Writes a small fp8scope run with the Python writer and numpy statistics only (no torch): a
two-layer stack of linear modules plus an `lm_head`, its forward and backward done in numpy, recorded
through `fp8scope.session.Session` exactly as `fp8scope.torch.Recorder` hands it device results.

At step `--nan-step` (default: none) one value of `layers.1.fc1`'s output becomes NaN, so the run has
a non-finite event whose first producing module is known. The Rust tests read what this writes with
the schemas crate and with `fp8-analyze`.

Usage: python3 synthetic.py OUT [--steps N] [--recipe delayed|current|bf16] [--nan-step S] [--crash-at S]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp8scope import fp8, stats as st  # noqa: E402
from fp8scope.recipe import Recipe  # noqa: E402
from fp8scope.session import FULL, Session, StepRecord  # noqa: E402

MODULES = [("layers.0.fc1", 16, 32), ("layers.0.fc2", 32, 16), ("layers.1.fc1", 16, 32), ("layers.1.fc2", 32, 16),
           ("lm_head", 16, 24)]
TOKENS = 8


def scale_of(session, module, role, x, fmt_name):
    """(scale, amax_used) the recipe uses for this cast."""
    if session.recipe.kind == "delayed":
        return session.scale(module, role)
    if session.recipe.kind == "current":
        a = float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))
        return fp8.scale_for_amax(fmt_name, a, session.recipe.margin), a
    a = float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))
    return 1.0, a


def emulated(session, x, role, scale):
    fmt_name = session.recipe.format_for(role)
    return st.quantize(fmt_name, x, scale)[1]


def record(session, rec, plan, module, role, x, dumped):
    fmt_name = session.recipe.format_for(role)
    scale, used = scale_of(session, module, role, x, fmt_name)
    rec.observations.append(("operand", module, role, st.raw_stats(x, fmt_name, scale, used, plan.level >= FULL)))
    if dumped:
        dump(session, rec, module, role, x, scale if session.recipe.is_fp8 else None)
    return scale


def dump(session, rec, module, role, x, scale):
    if role not in session.dump_roles:
        return
    rows, cols = x.shape
    off, n, stride = st.dump_window(rows, cols, session.dump_max_elems, session.dump_strided)
    vals = x.reshape(-1)[off: off + n * stride: stride].astype(np.float32)
    codes = fp8.cast(session.recipe.format_for(role), vals, scale) if scale is not None else None
    rec.observations.append(("dump", module, role, (rows, cols), off, stride, vals, codes, scale))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--recipe", default="delayed")
    ap.add_argument("--nan-step", type=int, default=0)
    ap.add_argument("--crash-at", type=int, default=0, help="raise inside step S (after its forward)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    weights = {m: (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32) for m, i, o in MODULES}
    session = Session(a.out, Recipe(a.recipe, amax_history=4), stats_every=1, quant_error_every=3, dump_every=5,
                      dump_layers=r"layers\.1\.", dump_max_elems=64, shadow=True, flush_every=4,
                      framework="numpy " + np.__version__, model={"layers": 2, "vocab": 24}, ln_vocab=float(np.log(24)),
                      notes=["synthetic: numpy forward and backward of five linear modules"], threaded=True)
    try:
        for step in range(1, a.steps + 1):
            plan = session.plan(step)
            rec = StepRecord()
            x = (rng.standard_normal((TOKENS, 16)) * 2.0).astype(np.float32)
            saved = []
            for module, _, _ in MODULES:
                w = weights[module]
                dumped = plan.dump and session.dumps_module(module)
                sx = record(session, rec, plan, module, "activation", x, dumped)
                sw = record(session, rec, plan, module, "weight", w, dumped)
                y = (x @ w.T).astype(np.float32)
                if step == a.nan_step and module == "layers.1.fc1":
                    y[0, 0] = np.nan
                rec.observations.append(("output", module, int(np.count_nonzero(~np.isfinite(y)))))
                if dumped:
                    dump(session, rec, module, "output", y, None)
                if plan.shadow and dumped:
                    t = fp8.round_bf16(emulated(session, x, "activation", sx) @ emulated(session, w, "weight", sw).T)
                    r = fp8.round_bf16(fp8.round_bf16(x) @ fp8.round_bf16(w).T)
                    rec.observations.append(("shadow", module, "fprop", st.shadow_raw(t, r)))
                saved.append((module, x, w))
                x = np.tanh(y).astype(np.float32) if module != "lm_head" else y
            if step == a.crash_at:
                raise RuntimeError(f"planted crash at step {step}")
            g = (rng.standard_normal(x.shape) * 1e-3).astype(np.float32)
            for module, xin, w in reversed(saved):
                dumped = plan.dump and session.dumps_module(module)
                record(session, rec, plan, module, "gradient", g, dumped)
                dx = (g @ w).astype(np.float32)
                if dumped:
                    dump(session, rec, module, "dgrad", dx, None)
                    dump(session, rec, module, "wgrad", (g.T @ xin).astype(np.float32), None)
                g = dx
            loss = float(np.log(24) * np.exp(-step / 20))
            if step == a.nan_step:
                loss = float("nan")
            if not session.end_step(step, rec, loss=loss, step_ms=1.0 + step, grad_norm=0.5, lr=1e-3,
                                    tokens=TOKENS, plan=plan):
                break
        session.finish("completed")
    except BaseException as e:
        session.finish("crashed", f"{type(e).__name__}: {e} (after step {session.steps_done})")
        raise


if __name__ == "__main__":
    main()
