// Shared helpers of fp8scope's kernels. The loader (capture/src/backend/cuda/kernels.rs) pastes this
// file in place of `#include "common.cuh"` before NVRTC compiles a kernel file, so every .cu is one
// self-contained translation unit. Needs <cuda_fp8.h> and <cuda_bf16.h> from the CUDA include dir.
#pragma once
#include <cuda_fp8.h>
#include <cuda_bf16.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

// Operand formats (FMT_BF16, FMT_E4M3, …), their largest values (E4M3_MAX, …), the FOR_EACH_FMT
// macros that instantiate a kernel per format, and the conversions fmt_max, fmt_interp, to_fp8 and
// from_fp8: generated from the quantization contract (schemas/src/element_formats.rs) by the
// loader (kernel_units.rs: formats_header), which pastes them here.
#include "formats.cuh"

// Scale slots (SLOT_FLOATS floats each, capture/src/backend/cuda/mod.rs mirrors the layout): slot[0]
// = the cast scale s (x is multiplied by it), slot[SLOT_BASE] = the true scale (s without a planted
// mis-scale: dequantisation uses it, as a stale scale would be used), slot[SLOT_INV] =
// 1/slot[SLOT_BASE], the dequantisation factor cuBLASLt reads through A/B_SCALE_POINTER; both
// 16-byte aligned, as cuBLASLt requires of scale pointers. slot[SLOT_RISKY] (a u32) is set by a
// cast that met a non-finite value or one past RISKY_ABS (cast_stats.cuh: stats_commit); the GEMM's
// non-finite count reads it (gemm_output.cu: gemm_nonfinite_count), and slot_flags_clear clears it
// before the slots are reused.
#define SLOT_BASE 1
#define SLOT_INV 4
#define SLOT_RISKY 7
#define SLOT_FLOATS 8
// Past this magnitude a value may make a GEMM's output overflow (gemm_nonfinite_count's bound).
#define RISKY_ABS 1099511627776.0f

__device__ __forceinline__ float round_bf16(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

// Value i of a buffer that holds f32 values, or BF16 values when bf16 is set (the two storages of
// the backend's DevBuf).
__device__ __forceinline__ float load_value(const void* __restrict__ p, u64 i, int bf16) {
    return bf16 ? __uint_as_float((u32)__ldg((const unsigned short*)p + i) << 16) : __ldg((const float*)p + i);
}

// p[i] = v, p holding f32 values, or BF16 values with bf16 (v must be a BF16 number: its low 16 bits
// are zero, so keeping the high half is exact).
__device__ __forceinline__ void store_value(void* __restrict__ p, u64 i, int bf16, float v) {
    if (bf16) ((unsigned short*)p)[i] = (unsigned short)(__float_as_uint(v) >> 16);
    else ((float*)p)[i] = v;
}

// Whether p (f32, or BF16 with bf16) is aligned for a 4-wide load (16 or 8 bytes).
__device__ __forceinline__ bool aligned4(const void* p, int bf16) {
    return ((u64)p & (bf16 ? 7 : 15)) == 0;
}

// The 4 BF16 values packed two to a word in w (the lower half first), as f32.
__device__ __forceinline__ void unpack_bf16x4(uint2 w, float (&v)[4]) {
    v[0] = __uint_as_float(w.x << 16);
    v[1] = __uint_as_float(w.x & 0xffff0000u);
    v[2] = __uint_as_float(w.y << 16);
    v[3] = __uint_as_float(w.y & 0xffff0000u);
}

// Values i..i+3 of p (f32, or BF16 with bf16) into v. With `vec` (p aligned4 and i a multiple of
// 4) one 16-byte (f32) or 8-byte (BF16) load reads them; else the first `valid` one by one, the
// rest 0.
__device__ __forceinline__ void load4(const void* __restrict__ p, u64 i, int bf16, bool vec, int valid, float (&v)[4]) {
    if (vec && bf16) {
        unpack_bf16x4(__ldg((const uint2*)((const unsigned short*)p + i)), v);
    } else if (vec) {
        float4 w = __ldg((const float4*)((const float*)p + i));
        v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
    } else {
        for (int k = 0; k < 4; k++) v[k] = k < valid ? load_value(p, i + k, bf16) : 0.0f;
    }
}

// Multi-tensor launches (capture/src/backend/cuda/multi_tensor.rs): one kernel over a list of
// buffers. The list is a table in device memory of `count` entries of MT_WORDS words each: word
// MT_START the entry's first block (increasing from 0), MT_BLOCKS its blocks, MT_N its values,
// MT_FLAGS its flags (bit 0: BF16 storage), then up to four buffer addresses from MT_PTR on. The
// blocks of one entry stand for the grid a launch of that buffer alone would have had.
#define MT_WORDS 8
#define MT_START 0
#define MT_BLOCKS 1
#define MT_N 2
#define MT_FLAGS 3
#define MT_PTR 4

// The entry block `block` works on in a table of entries of `words` words, each starting with its
// first block: the last whose first block is at most `block` (a binary search: the table is read
// through the cache, a few words a block).
__device__ __forceinline__ const u64* mt_entry_of(const u64* __restrict__ table, int count, u64 block, int words) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (__ldg(table + (u64)mid * words) <= block) lo = mid; else hi = mid - 1;
    }
    return table + (u64)lo * words;
}
__device__ __forceinline__ const u64* mt_entry(const u64* __restrict__ table, int count, u64 block) {
    return mt_entry_of(table, count, block, MT_WORDS);
}

// lo and hi rounded to BF16 (round to nearest even) and packed in one word, lo in the lower half.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
}

// Per-tensor scale from an amax, as crate::fp8::scale_for_amax: (max / amax) / 2^margin, 1 when the
// amax is zero or not finite.
// Clamped to [FLT_MIN, FLT_MAX] like the CPU's.
__device__ __forceinline__ float scale_for_amax(int fmt, float amax, int margin) {
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    float s = ldexpf(fmt_max(fmt) / amax, -margin);
    if (isnan(s)) return 3.402823466e38f;
    return fminf(fmaxf(s, 1.175494351e-38f), 3.402823466e38f);
}

// RoPE on one (i, i + HD/2) pair as the CPU reference computes it (capture/src/layers/rope.rs):
// two products and one sum per output, uncontracted (__fmul_rn, __fadd_rn, __fsub_rn), so the GPU
// matches it bit for bit. rope_pair_fwd rotates by the position's angle (c = cos, s = sin);
// rope_pair_bwd by its negative (the gradient's rotation).
__device__ __forceinline__ void rope_pair_fwd(float x1, float x2, float c, float s, float& o1, float& o2) {
    o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}
__device__ __forceinline__ void rope_pair_bwd(float y1, float y2, float c, float s, float& d1, float& d2) {
    d1 = __fadd_rn(__fmul_rn(y1, c), __fmul_rn(y2, s));
    d2 = __fsub_rn(__fmul_rn(y2, c), __fmul_rn(y1, s));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_min(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum of doubles in a fixed order (warp tree, then warp 0 over the warp sums), so that the
// same launch gives the same bits every time. Every thread must call it; the result is valid in
// thread 0. `sh` holds at least 32 doubles.
__device__ __forceinline__ double block_sum_d(double v, double* sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nw = (blockDim.x + 31) >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double r = 0.0;
    if (warp == 0) {
        r = lane < nw ? sh[lane] : 0.0;
        r = warp_sum_d(r);
    }
    return r;
}
