#!/usr/bin/env python3
"""A PyTorch peer with every layer GEMM in FP8, forward and backward, under torch.compile: the
PyTorch counterpart of fp8-capture's FP8 recipe, to set its speed-up over torch.compile's own BF16
(bench/torch_tiny.py, bench/torch_llama.py) beside ours over our BF16 (a machine with an H200).

Models (--model): `seed` is torch_tiny.py's (the encoder's qkv, attention out, FFN 1 and 2 in FP8);
`llama-1b` is torch_llama.py's Hugging Face LlamaForCausalLM (q, k, v, o, gate, up and down
projections of every decoder layer in FP8). Each such linear layer runs its three GEMMs through
torch._scaled_mm (cuBLASLt) with per-tensor current scaling, as Transformer Engine's FP8 recipe
lays them out: fprop E4M3 x E4M3 with fast accumulation; dgrad E5M2 dY x E4M3 W; wgrad E5M2 dY^T x
E4M3 X^T (the transposed operands quantised once in the forward and saved, as a dual cast does).
The lm_head stays BF16, as in fp8-capture. Outputs BF16; master weights, AdamW (fused) and the
loss in fp32, autocast BF16 elsewhere. torch.compile fuses the casts, amaxes and transposes.

Usage: python3 bench/torch_fp8_peer.py [--model seed|llama-1b] [--batch N] [--steps 30] [--warmup 10]
Prints one JSON line starting with RESULT (the fields of the BF16 peer of the same model).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_tiny  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FMAX = {E4M3: 448.0, E5M2: 57344.0}


def quant(t, fmt):
    """Per-tensor current scaling: (codes, dequantisation scale as an fp32 0-d tensor)."""
    amax = t.abs().amax().float().clamp(min=1e-12)
    scale = FMAX[fmt] / amax
    q = (t.float() * scale).clamp(-FMAX[fmt], FMAX[fmt]).to(fmt)
    return q, scale.reciprocal()


class _FP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        xq, xs = quant(x2, E4M3)
        wq, ws = quant(w, E4M3)
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, bias=None if b is None else b.to(torch.bfloat16),
                             out_dtype=torch.bfloat16, use_fast_accum=True)
        # dgrad reads W^T and wgrad X^T, K-contiguous: the transposed codes, made here once.
        ctx.save_for_backward(xq.t().contiguous(), xs, wq.t().contiguous(), ws)
        ctx.has_bias = b is not None
        ctx.shp = shp
        ctx.x_dtype = x.dtype
        return y.reshape(*shp[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xtq, xs, wtq, ws = ctx.saved_tensors
        g = gy.reshape(-1, gy.shape[-1])
        gq, gs = quant(g, E5M2)
        # dgrad: dX (M x K) = dY (M x N) . W (N x K); B column-major (N x K) = (W^T, K x N row-major)^T.
        gx = torch._scaled_mm(gq, wtq.t(), scale_a=gs, scale_b=ws, out_dtype=torch.bfloat16)
        # wgrad: dW (N x K) = dY^T (N x M) . X (M x K); B column-major (M x K) = (X^T, K x M)^T.
        gw = torch._scaled_mm(gq.t().contiguous(), xtq.t(), scale_a=gs, scale_b=xs, out_dtype=torch.bfloat16)
        gb = g.float().sum(0) if ctx.has_bias else None
        return gx.reshape(ctx.shp).to(ctx.x_dtype), gw.float(), gb


class FP8Linear(nn.Linear):
    def forward(self, x):
        return _FP8Linear.apply(x, self.weight, self.bias)


def check(dev):
    """A layer's output and gradients against BF16 nn.Linear: relative L2 errors (FP8-sized)."""
    torch.manual_seed(1)
    lin = FP8Linear(1024, 4096).to(dev)
    ref = nn.Linear(1024, 4096).to(dev)
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(2048, 1024, device=dev, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, yr = lin(x), ref(x2)
    g = torch.randn_like(yr)
    y.backward(g)
    yr.backward(g)
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    return {"fwd_rel": rel(y, yr), "dx_rel": rel(x.grad, x2.grad), "dw_rel": rel(lin.weight.grad, ref.weight.grad),
            "db_rel": rel(lin.bias.grad, ref.bias.grad)}


def seed_model(dev, batch):
    """torch_tiny.py's model with its encoder GEMMs in FP8: (model, forward, vocab, seq, RESULT fields)."""
    model = torch_tiny.Model(attn=FP8Linear, ffn_lin=FP8Linear).to(dev)
    fwd = torch.compile(model)
    return model, lambda tok: fwd(tok), torch_tiny.VOCAB, torch_tiny.SEQ, {}


def llama_model(dev, batch):
    """torch_llama.py's llama-1b with every decoder layer's projections in FP8 (same fields)."""
    import torch_llama
    from transformers import LlamaConfig, LlamaForCausalLM

    p = dict(torch_llama.PRESETS["llama-1b"], batch=batch)
    cfg = LlamaConfig(vocab_size=p["vocab"], hidden_size=p["dim"], intermediate_size=p["ffn"],
                      num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
                      num_key_value_heads=p["kv_heads"], max_position_embeddings=p["seq"],
                      rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    for layer in model.model.layers:
        for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")), (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for n in names:
                old = getattr(parent, n)
                new = FP8Linear(old.in_features, old.out_features, bias=False)
                new.weight = old.weight
                setattr(parent, n, new)
    model = model.to(dev)
    fwd = torch.compile(model)
    n_params = sum(q.numel() for q in model.parameters())
    return model, lambda tok: fwd(input_ids=tok, use_cache=False).logits, p["vocab"], p["seq"], {
        "peer": "hf-llama-fp8", "preset": "llama-1b", **p, "params_M": round(n_params / 1e6, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="seed", choices=["seed", "llama-1b"])
    ap.add_argument("--batch", type=int, help="sequences a step (seed: 32, llama-1b: 4)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    batch = a.batch or (32 if a.model == "seed" else 4)
    errors = check(dev)
    model, forward, V, S, fields = (seed_model if a.model == "seed" else llama_model)(dev, batch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    tok = torch.randint(0, V, (batch, S), device=dev)
    tgt = torch.randint(0, V, (batch, S), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(tok)
        loss = F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    torch.cuda.reset_peak_memory_stats()
    first = step().item()
    for _ in range(a.warmup - 1):
        step()
    torch.cuda.synchronize()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t1 = time.perf_counter()
    ev0.record()
    for _ in range(a.steps):
        loss = step()
    ev1.record()
    torch.cuda.synchronize()
    ms = ev0.elapsed_time(ev1) / a.steps
    res = {
        **fields,
        "variant": "fp8_full_compile_fused",
        "batch": batch,
        "ms_step": round(ms, 2),
        "ms_step_wall": round((time.perf_counter() - t1) / a.steps * 1e3, 2),
        "tok_s": round(batch * S / (ms / 1e3)),
        "loss_first": round(first, 4),
        "loss_last": round(loss.item(), 4),
        "peak_mem_MiB": round(torch.cuda.max_memory_allocated() / 2**20),
        "fp8_linear_check": errors,
    }
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
