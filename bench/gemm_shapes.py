#!/usr/bin/env python3
"""The linear layers' GEMMs of a preset, alone, as PyTorch runs them (a machine with an H200 and
PyTorch): FP8 through torch._scaled_mm (cuBLASLt, the TN layout fp8-capture uses: E4M3 x E4M3
with fast accumulation for the forward, E5M2 x E4M3 for dgrad and wgrad, BF16 outputs) and BF16
through torch.mm, timed with CUDA events over back-to-back repetitions. Set beside
bench/step_kernels.sh's table of fp8-capture's own GEMM kernels, it says whether the engine's FP8
GEMMs leave speed on the table at the preset's shapes, and what FP8 GEMMs can buy over BF16 there.

Usage: python3 bench/gemm_shapes.py [--preset seed-b32|llama-1b] [--reps 50] [--json OUT]
"""
import argparse
import json

import torch

PRESETS = {
    # tokens, then (module, in features, out features)
    "seed-b32": (32 * 512, [("qkv", 1024, 3072), ("proj", 1024, 1024), ("fc1", 1024, 4096), ("fc2", 4096, 1024)]),
    "llama-1b": (4 * 2048, [("qkv", 2048, 3072), ("proj", 2048, 2048), ("fc1", 2048, 16384), ("fc2", 8192, 2048)]),
}


def shapes(tokens, modules):
    """(module, gemm, rows, cols, k) of D (rows x cols) = P (rows x k) . Q (cols x k)^T."""
    for name, fin, fout in modules:
        yield name, "fprop", tokens, fout, fin
        yield name, "dgrad", tokens, fin, fout
        yield name, "wgrad", fout, fin, tokens


def timed(fn, reps):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1000.0  # µs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="seed-b32", choices=sorted(PRESETS))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    tokens, modules = PRESETS[args.preset]
    dev = "cuda"
    one = torch.ones((), device=dev, dtype=torch.float32)
    rows_out = []
    print(f"{args.preset}: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'gemm':<12} {'rows':>6} {'cols':>6} {'k':>6}  {'fp8 µs':>8} {'TFLOP/s':>8}  {'bf16 µs':>8} {'TFLOP/s':>8}  bf16/fp8")
    tot8 = tot16 = 0.0
    for name, gemm, rows, cols, k in shapes(tokens, modules):
        ta = torch.float8_e4m3fn if gemm == "fprop" else torch.float8_e5m2
        p = (torch.randn(rows, k, device=dev) * 0.5).to(ta)
        q = (torch.randn(cols, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
        fast = gemm == "fprop"
        us8 = timed(lambda: torch._scaled_mm(p, q.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast), args.reps)
        pb, qb = p.to(torch.bfloat16), q.to(torch.bfloat16)
        us16 = timed(lambda: torch.mm(pb, qb.t()), args.reps)
        flop = 2.0 * rows * cols * k
        tot8 += us8
        tot16 += us16
        row = dict(module=name, gemm=gemm, rows=rows, cols=cols, k=k, fp8_us=us8, bf16_us=us16,
                   fp8_tflops=flop / us8 / 1e6, bf16_tflops=flop / us16 / 1e6)
        rows_out.append(row)
        print(f"{name + '.' + gemm:<12} {rows:>6} {cols:>6} {k:>6}  {us8:>8.1f} {row['fp8_tflops']:>8.0f}  {us16:>8.1f} {row['bf16_tflops']:>8.0f}  {us16 / us8:>6.2f}")
    print(f"a layer's 12 GEMMs: fp8 {tot8:.1f} µs, bf16 {tot16:.1f} µs, bf16/fp8 {tot16 / tot8:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(preset=args.preset, rows=rows_out, fp8_us=tot8, bf16_us=tot16), f, indent=1)


if __name__ == "__main__":
    main()
