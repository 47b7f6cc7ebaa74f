"""The PyTorch recorder (python/, `fp8scope.torch.Recorder`) on the model of bench/torch_tiny.py
(Embedding(32000, 1024) → 12 pre-LN encoder layers, 16 heads, FFN 4096 → Linear(1024, 32000); one
fixed batch of 4 × 512 random tokens, AdamW 3e-4, bf16 autocast). Attention uses torch_tiny's
`SelfAttention` (qkv and output projections as Linear modules that run, unlike
nn.MultiheadAttention's), so every layer has four recorded GEMM sites: self_attn.qkv, self_attn.out,
linear1, linear2 (plus head).

  train --variant bf16       every Linear in BF16, recorded with recipe="bf16" (the baseline)
  train --variant fp8        the encoder's Linears do their forward with torch._scaled_mm on E4M3
                             inputs, per-tensor current scaling (torch_tiny's FP8Linear), recorded
                             with recipe="current" and shadow GEMMs (the recorder's emulation of the
                             recipe's casts against BF16)
  train --variant fp8-fault  fp8, with a planted fault: from --fault-step on, the activation cast of
                             --fault-module's fprop uses a scale 2^--fault-exp too large (dequantized
                             with the true one, as a stale or corrupted scale would be); shadow GEMMs
                             compare each FP8 layer's own output with BF16 on the same inputs
                             GEMMs: they emulate the recipe's correct cast, not the model's, so
                             `fp8-analyze locate` works from the dumps against the BF16 run
  overhead                   ms/step without and with the recorder (stats every step, no dumps),
                             side by side in one process, eager and torch.compile'd, and the ratio

Usage:
  python3 bench/torch_recorder.py train --variant bf16 --out runs/torch-bf16 [--steps 300]
  python3 bench/torch_recorder.py overhead [--steps 30 --rounds 3]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch_tiny as tt  # noqa: E402

import fp8scope.torch  # noqa: E402


class _FP8Matmul(torch.autograd.Function):
    """torch_tiny's FP8 forward (E4M3, per-tensor current scaling, torch._scaled_mm), with an
    optional factor on the activation's cast scale (the planted fault); backward in BF16."""

    @staticmethod
    def forward(ctx, x, w, b, x_scale_mult):
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        amax = x2.abs().amax().float().clamp(min=1e-12)
        scale = tt.E4M3_MAX / amax
        xq = (x2.float() * (scale * x_scale_mult)).clamp(-tt.E4M3_MAX, tt.E4M3_MAX).to(torch.float8_e4m3fn)
        wq, ws = tt._quant(w)
        y = torch._scaled_mm(xq, wq.t(), scale_a=scale.reciprocal(), scale_b=ws,
                             bias=None if b is None else b.to(torch.bfloat16), out_dtype=torch.bfloat16)
        ctx.save_for_backward(x2.to(torch.bfloat16), w.to(torch.bfloat16))
        ctx.has_bias, ctx.shp, ctx.x_dtype = b is not None, shp, x.dtype
        return y.reshape(*shp[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xb, wb = ctx.saved_tensors
        g = gy.reshape(-1, gy.shape[-1]).to(torch.bfloat16)
        gx = (g @ wb).reshape(ctx.shp).to(ctx.x_dtype)
        return gx, (g.t() @ xb).float(), g.float().sum(0) if ctx.has_bias else None, None


class FP8Linear(nn.Linear):
    """An nn.Linear whose forward runs in FP8; `x_scale_mult` ≠ 1 plants a mis-scaled activation cast."""

    x_scale_mult = 1.0

    def forward(self, x):
        return _FP8Matmul.apply(x, self.weight, self.bias, self.x_scale_mult)


def build(variant):
    """The model (the same weights and batch for every variant) and its batch. FP8 variants turn the
    encoder's Linear modules into FP8Linear in place, so that initialisation draws the same numbers."""
    torch.manual_seed(0)
    model = tt.Model(attn=nn.Linear, ffn_lin=nn.Linear).cuda()
    if variant.startswith("fp8"):
        for m in model.layers.modules():
            if type(m) is nn.Linear:
                m.__class__ = FP8Linear
    tok = torch.randint(0, tt.VOCAB, (tt.BATCH, tt.SEQ), device="cuda")
    tgt = torch.randint(0, tt.VOCAB, (tt.BATCH, tt.SEQ), device="cuda")
    return model, tok, tgt


def train_step(fwd, opt, tok, tgt):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = fwd(tok)
    loss = F.cross_entropy(logits.float().view(-1, tt.VOCAB), tgt.view(-1))
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], float("inf"))
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss, gn


def train(a):
    model, tok, tgt = build(a.variant)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    fwd = torch.compile(model) if a.compile else model
    fp8 = a.variant.startswith("fp8")
    faulty = dict(model.named_modules())[a.fault_module] if a.variant == "fp8-fault" else None
    rec = fp8scope.torch.Recorder(model, out=a.out, recipe="current" if fp8 else "bf16", stats_every=1,
                                  dump_every=a.dump_every, dump_layers=a.dump_layers, shadow=fp8,
                                  vocab=tt.VOCAB,
                                  optimizer=opt, steps=a.steps,
                                  notes=[f"bench/torch_recorder.py train --variant {a.variant}"]
                                  + ([f"planted: {a.fault_module} fprop activation scale x 2^{a.fault_exp} from step "
                                      f"{a.fault_step}"] if faulty is not None else []))
    t0 = time.perf_counter()
    with rec:
        for step in range(1, a.steps + 1):
            if faulty is not None and step == a.fault_step:
                faulty.x_scale_mult = 2.0 ** a.fault_exp
            loss, gn = train_step(fwd, opt, tok, tgt)
            rec.step(loss, grad_norm=gn, tokens=tt.BATCH * tt.SEQ)
            if rec.closed:
                break
            if step % 50 == 0:
                print(f"{a.variant} step {step} loss {loss.item():.4f}", flush=True)
    m = json.load(open(os.path.join(a.out, "run.json")))
    print("RESULT " + json.dumps({"variant": a.variant, "status": m["status"], "steps": m["steps_completed"],
                                  "final_loss": m["final_loss"], "rows": m["rows"], "error": m["error"],
                                  "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


def timed(fwd, opt, tok, tgt, steps, rec=None):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        loss, gn = train_step(fwd, opt, tok, tgt)
        if rec is not None:
            rec.step(loss, grad_norm=gn)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


def overhead(a):
    model, tok, tgt = build("bf16")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for mode in ("eager", "compiled"):
            fwd = torch.compile(model) if mode == "compiled" else model
            configs = [("off", None)] + [(f"on fused={f}", f) for f in (["auto", False] if mode == "eager" else ["auto"])]
            times = {c: [] for c, _ in configs}
            for r in range(a.rounds):
                for label, fused in configs:
                    rec = None
                    if fused is not None:
                        rec = fp8scope.torch.Recorder(model, out=os.path.join(d, f"{mode}-{label}-{r}".replace(" ", "_")),
                                                      recipe="delayed", stats_every=1, fused=fused, flush_every=1000)
                    timed(fwd, opt, tok, tgt, a.warmup, rec)  # compiles, recompiles after hooks change
                    times[label].append(timed(fwd, opt, tok, tgt, a.steps, rec))
                    if rec is not None:
                        rec.close()
            base = min(times["off"])
            for label, _ in configs:
                ms = min(times[label])
                rows.append((mode, label, ms, ms / base))
    print(f"{'model':<9} {'recorder':<16} {'ms/step':>8} {'ratio':>6}   (best of {a.rounds} rounds of {a.steps} steps)")
    for mode, label, ms, ratio in rows:
        print(f"{mode:<9} {label:<16} {ms:>8.2f} {ratio:>6.3f}")
    print("RESULT " + json.dumps([{"model": m, "recorder": l, "ms_step": round(ms, 3), "ratio": round(r, 4)}
                                  for m, l, ms, r in rows]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--variant", choices=["bf16", "fp8", "fp8-fault"], required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--dump-every", type=int, default=50)
    t.add_argument("--dump-layers", default=".*")
    t.add_argument("--fault-module", default="layers.5.linear1")
    t.add_argument("--fault-step", type=int, default=150)
    t.add_argument("--fault-exp", type=int, default=8)
    t.add_argument("--compile", action="store_true", help="train the torch.compile'd model")
    o = sub.add_parser("overhead")
    o.add_argument("--steps", type=int, default=30)
    o.add_argument("--warmup", type=int, default=8)
    o.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_recorder.py: needs a CUDA GPU (torch._scaled_mm and the bench model)")
    train(a) if a.cmd == "train" else overhead(a)


if __name__ == "__main__":
    main()
