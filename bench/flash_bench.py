#!/usr/bin/env python3
"""The fused attention's kernels alone, variant against variant, on a GPU: each variant is a CUBIN
of kernels/flash_attention.cu compiled here by NVRTC with its tuning macros set
(bench/flash_variants.sh builds them with bench/kernel_regs.py), loaded through the CUDA driver
into PyTorch's context, and timed kernel by kernel (forward, dK/dV, dQ) on one attention call of
a preset's shape. Every variant's outputs are compared bit for bit with the first's: a variant
that changes a bit is reported as such, whatever its speed.

Usage (on the GPU machine, which has PyTorch):
  bench/flash_bench.py OUT.json NAME=FILE.cubin:MT_FWD:MT_DQ[:OPTION...] [...] [--shape B,T,NH,KVH,D] [--rounds N]
The first variant is the reference. MT_FWD and MT_DQ are the query tiles per block the variant was
compiled with up to head size 64 (they set the grids and the shared memory; above 64 the kernels
take one, as flash_variants.sh builds them). The grids are (heads, B, tiles), the
kernels' order since they start their heaviest tiles first. Options, for builds that differ from
the kernels as they ship: `tiles-x` launches a build from before that order on (tiles, heads, B);
`dkdv-bufs=N` gives dK/dV shared memory for N buffers of q and dout (the shipped kernel streams
them through 2; bench/results/2026-12-02-attention-order/call7/dkdv_three_buffers.patch adds the
FA_DKDV_BUFS knob that tried 3); `ptr-args` passes q, k, v and dout as plain pointers to
head-major matrices, for builds from before the kernels took strided tensors (FaTensor); `rows`
has the kernels read q, k, v from BF16 qkv rows (B, T, (NH + 2 KVH) D) and dout from BF16 rows
(B, T, NH D) in place, as the engine does for GPT's BF16 buffers; `f32-args` launches a build from
before the kernels took the out16 / dqkv16 flags (its outputs are f32 rows; `ptr-args` builds are
such builds); `out16` has the kernels write out and dqkv as BF16 rows, as the engine does for GPT's
16-bit buffers (compared with the reference's f32 values; needs --no-rope). The default shape is
llama-1b's attention (4, 2048, 32, 8, 64); the RoPE table is passed to the backward as llama-1b
passes it, unless --no-rope (GPT's attention, as the seed preset runs it).
"""
import ctypes
import json
import math
import statistics
import sys

import torch

TILE = 64
THREADS = 128


class FaTensor(ctypes.Structure):
    """flash_attention.cu's FaTensor: element (b, h, t, d) at p[b batch + h head + t row + d]."""
    _fields_ = [("p", ctypes.c_uint64), ("batch", ctypes.c_int64), ("head", ctypes.c_uint32), ("row", ctypes.c_uint32)]


def head_major(x):
    """A contiguous (B, H, T, D) BF16 tensor."""
    _, h, t, d = x.shape
    return FaTensor(x.data_ptr(), h * t * d, t * d, d)


def in_rows(rows, col0, d):
    """Heads of D columns from column col0 of contiguous BF16 rows (B, T, W)."""
    _, t, w = rows.shape
    return FaTensor(rows.data_ptr() + 2 * col0, t * w, d, w)


def die(msg):
    sys.exit(f"flash_bench.py: {msg}")


class Driver:
    """The few CUDA driver calls the launches need, through ctypes."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")

    def check(self, rc, what):
        if rc != 0:
            s = ctypes.c_char_p()
            self.cu.cuGetErrorString(rc, ctypes.byref(s))
            die(f"{what}: CUDA error {rc} ({s.value.decode() if s.value else '?'})")

    def load(self, image):
        mod = ctypes.c_void_p()
        self.check(self.cu.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
        return mod

    def function(self, mod, name, smem):
        f = ctypes.c_void_p()
        self.check(self.cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), f"cuModuleGetFunction {name}")
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
        self.check(self.cu.cuFuncSetAttribute(f, 8, ctypes.c_int(smem)), f"cuFuncSetAttribute {name}")
        return f

    def launch(self, f, grid, smem, args):
        vals = []
        for a in args:
            if isinstance(a, (ctypes.Structure, ctypes.c_uint64)):
                vals.append(a)
            elif isinstance(a, torch.Tensor):
                vals.append(ctypes.c_uint64(a.data_ptr()))
            elif isinstance(a, float):
                vals.append(ctypes.c_float(a))
            elif isinstance(a, int) and a >= 1 << 31:
                vals.append(ctypes.c_uint64(a))
            else:
                vals.append(ctypes.c_int(a))
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.check(self.cu.cuLaunchKernel(f, grid[0], grid[1], grid[2], THREADS, 1, 1, smem, stream, ptrs, None),
                   "cuLaunchKernel")


def tile_bytes(d):
    return TILE * (d + 8) * 2


def inputs(b, t, nh, kvh, d):
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(b, nh, t, d, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(b, kvh, t, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(b, kvh, t, d, device="cuda", generator=g).to(torch.bfloat16)
    dout = torch.randn(b, t, nh * d, device="cuda", generator=g) * 1e-3
    dy = dout.view(b, t, nh, d).permute(0, 2, 1, 3).to(torch.bfloat16).contiguous()
    pos = torch.arange(t, device="cuda", dtype=torch.float32)[:, None]
    freq = 10000.0 ** (-torch.arange(0, d // 2, device="cuda", dtype=torch.float32) * 2 / d)
    ang = pos * freq[None, :]
    rope = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).contiguous()
    return q, k, v, dout, dy, rope


def main():
    args = sys.argv[1:]
    shape = (4, 2048, 32, 8, 64)
    rounds = 3
    if "--shape" in args:
        i = args.index("--shape")
        shape = tuple(int(x) for x in args[i + 1].split(","))
        del args[i:i + 2]
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    use_rope = "--no-rope" not in args
    args = [a for a in args if a != "--no-rope"]
    if len(args) < 2:
        die("usage: flash_bench.py OUT.json NAME=FILE.cubin:MT_FWD:MT_DQ [...] [--shape B,T,NH,KVH,D] [--rounds N] [--no-rope]")
    out_json, specs = args[0], args[1:]
    b, t, nh, kvh, d = shape
    scale = 1.0 / math.sqrt(d)
    drv = Driver()
    torch.zeros(1, device="cuda")
    variants = []
    for s in specs:
        name, rest = s.split("=", 1)
        fields = rest.split(":")
        if len(fields) < 3:
            die(f"{s}: expected NAME=FILE.cubin:MT_FWD:MT_DQ[:tiles-x][:dkdv-bufs=N][:ptr-args][:rows][:f32-args][:out16]")
        path, mt_fwd, mt_dq = fields[0], int(fields[1]), int(fields[2])
        if d > 64:
            mt_fwd = mt_dq = 1
        tiles_x, bufs, ptr_args, rows, f32_args, out16 = False, 2, False, False, False, False
        for opt in fields[3:]:
            if opt == "tiles-x":
                tiles_x = True
            elif opt == "ptr-args":
                ptr_args = f32_args = True
            elif opt == "f32-args":
                f32_args = True
            elif opt == "out16":
                out16 = True
            elif opt == "rows":
                rows = True
            elif opt.startswith("dkdv-bufs="):
                bufs = int(opt.split("=", 1)[1])
            else:
                die(f"{s}: unknown option {opt} (tiles-x, dkdv-bufs=N, ptr-args, rows, f32-args, out16)")
        if ptr_args and rows:
            die(f"{s}: ptr-args builds read head-major matrices only (drop rows)")
        if out16 and (f32_args or use_rope):
            die(f"{s}: out16 needs a build with the out16 flags (no f32-args, ptr-args) and --no-rope (rotated dq, dk are not BF16 numbers)")
        mod = drv.load(open(path, "rb").read())
        tb = tile_bytes(d)
        sm = {"fwd": (mt_fwd + 4) * tb, "dkdv": (2 + 2 * bufs) * tb, "dq": (2 * mt_dq + 4) * tb}
        variants.append({
            "name": name, "mt_fwd": mt_fwd, "mt_dq": mt_dq, "smem": sm, "tiles_x": tiles_x, "ptr_args": ptr_args, "rows": rows,
            "f32_args": f32_args, "out16": out16,
            "fwd": drv.function(mod, f"flash_fwd_d{d}", sm["fwd"]),
            "dkdv": drv.function(mod, f"flash_bwd_dkdv_d{d}", sm["dkdv"]),
            "dq": drv.function(mod, f"flash_bwd_dq_d{d}", sm["dq"]),
            "delta": drv.function(mod, "flash_bwd_delta", 0),
        })
    q, k, v, dout, dy, rope = inputs(b, t, nh, kvh, d)
    w = (nh + 2 * kvh) * d
    # The same values as rows, for `rows` variants.
    qkv_rows = torch.cat([x.permute(0, 2, 1, 3).reshape(b, t, -1) for x in (q, k, v)], dim=2).contiguous()
    dout_rows = dy.permute(0, 2, 1, 3).reshape(b, t, nh * d).contiguous()

    def tensors(var):
        """q, k, v, dy as the variant's kernels take them."""
        if var["ptr_args"]:
            return [q, k, v, dy]
        if var["rows"]:
            return [in_rows(qkv_rows, 0, d), in_rows(qkv_rows, nh * d, d), in_rows(qkv_rows, (nh + kvh) * d, d), in_rows(dout_rows, 0, d)]
        return [head_major(x) for x in (q, k, v, dy)]

    def grid(var, heads, tiles):
        return (tiles, heads, b) if var["tiles_x"] else (heads, b, tiles)

    rope_arg = rope if use_rope else ctypes.c_uint64(0)  # a null pointer

    def dst(var, x):
        """An output tensor and, for builds that take it, its 16-bit flag."""
        return [x] if var["f32_args"] else [x, int(var["out16"])]

    def fwd(var, out, lse):
        grid_ = grid(var, nh, (t + TILE * var["mt_fwd"] - 1) // (TILE * var["mt_fwd"]))
        drv.launch(var["fwd"], grid_, var["smem"]["fwd"], [*dst(var, out), lse, *tensors(var)[:3], t, nh, kvh, scale, 1])

    def dkdv(var, dqkv, lse, delta):
        drv.launch(var["dkdv"], grid(var, kvh, (t + TILE - 1) // TILE), var["smem"]["dkdv"], [*dst(var, dqkv), *tensors(var), lse, delta, t, nh, kvh, scale, 1, rope_arg])

    def dq(var, dqkv, lse, delta):
        drv.launch(var["dq"], grid(var, nh, (t + TILE * var["mt_dq"] - 1) // (TILE * var["mt_dq"])), var["smem"]["dq"], [*dst(var, dqkv), *tensors(var), lse, delta, t, nh, kvh, scale, 1, rope_arg])

    # The reference's forward and correction term feed every variant's backward.
    ref = variants[0]
    out_ref = torch.empty(b, t, nh * d, device="cuda")
    lse_ref = torch.empty(b, nh, t, device="cuda")
    fwd(ref, out_ref, lse_ref)
    delta = torch.empty(b, nh, t, device="cuda")
    out_flag = [] if ref["f32_args"] else [0]
    drv.launch(ref["delta"], (((b * t * nh) + 7) // 8, 1, 1), 0, [delta, dout, 0, out_ref, *out_flag, b, t, nh, d])
    dqkv_ref = torch.zeros(b, t, w, device="cuda")
    dkdv(ref, dqkv_ref, lse_ref, delta)
    dq(ref, dqkv_ref, lse_ref, delta)
    torch.cuda.synchronize()

    def same(a, r):
        a = a.float()
        if torch.equal(a.view(torch.int32), r.view(torch.int32)):
            return "identical"
        diff = (a - r).abs().max().item()
        n = (a.view(torch.int32) != r.view(torch.int32)).sum().item()
        return f"DIFFERS ({n} values, max |diff| {diff:.3g})"

    results = []
    for var in variants:
        ty = torch.bfloat16 if var["out16"] else torch.float32
        out = torch.empty_like(out_ref, dtype=ty)
        lse = torch.empty_like(lse_ref)
        fwd(var, out, lse)
        dqkv = torch.zeros_like(dqkv_ref, dtype=ty)
        dkdv(var, dqkv, lse_ref, delta)
        dq(var, dqkv, lse_ref, delta)
        torch.cuda.synchronize()
        var["bits"] = {"out": same(out, out_ref), "lse": same(lse, lse_ref), "dqkv": same(dqkv, dqkv_ref)}
        var["times"] = {"fwd": [], "dkdv": [], "dq": []}
        var["bufs"] = (out, lse, dqkv)
    # Rounds over the variants in turn, each kernel timed alone with events, 10 launches a round.
    for _ in range(rounds):
        for var in variants:
            out, lse, dqkv = var["bufs"]
            for kern, call in (("fwd", lambda: fwd(var, out, lse)), ("dkdv", lambda: dkdv(var, dqkv, lse_ref, delta)),
                               ("dq", lambda: dq(var, dqkv, lse_ref, delta))):
                call()
                for _ in range(10):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    call()
                    e1.record()
                    e1.synchronize()
                    var["times"][kern].append(e0.elapsed_time(e1) * 1000.0)
    print(f"shape B={b} T={t} NH={nh} KVH={kvh} D={d}, causal, {rounds} rounds of 10 launches; µs a call (median)")
    print(f"{'variant':<22} {'fwd':>8} {'dkdv':>8} {'dq':>8} {'bwd':>8}   bits against {ref['name']}")
    for var in variants:
        med = {kk: statistics.median(vv) for kk, vv in var["times"].items()}
        bits = ", ".join(f"{kk} {vv}" for kk, vv in var["bits"].items())
        print(f"{var['name']:<22} {med['fwd']:>8.1f} {med['dkdv']:>8.1f} {med['dq']:>8.1f} {med['dkdv'] + med['dq']:>8.1f}   {bits}")
        results.append({"name": var["name"], "median_us": med, "bits": var["bits"],
                        "spread_us": {kk: [min(vv), max(vv)] for kk, vv in var["times"].items()}})
    json.dump({"shape": shape, "rounds": rounds, "variants": results}, open(out_json, "w"), indent=1)


if __name__ == "__main__":
    main()
