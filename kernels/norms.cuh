// The element math of the normalizations before the attention and the MLP (RMSNorm for Llama,
// LayerNorm for GPT): one output value from its input, its row's saved statistics (rstd, and the
// mean for LayerNorm) and its column's gain (and bias). One definition for the kernels that write
// the normalized tensor (rmsnorm.cu, layernorm.cu) and the casts that compute it as they read their
// input (cast.cu, cast_src_*), so both produce the same bits. The roundings are explicit
// (__fmul_rn, __fsub_rn, __fmaf_rn): the ones the compiler chose for the kernels' plain
// expressions (x * r * w; (x - m) * r * w + b contracted to one FMA), so that the bits do not
// depend on a schedule. The loader (capture/src/backend/cuda/kernels.rs) pastes this file in place
// of `#include "norms.cuh"`, after common.cuh.
#pragma once

// The row statistics, each from the partial sums of a warp's lanes over the row (lane l taking
// columns l, l + 32, ... in order) reduced by warp_sum: RMSNorm's rstd from the sum of squares
// (rms_sq_add, one FMA a value), 1 / sqrt(ss * (1/c) + eps) with the product and sum fused;
// LayerNorm's mean, then its rstd from the sum of (x - mean)^2 (ln_sq_add).
__device__ __forceinline__ float rms_sq_add(float s, float x) {
    return __fmaf_rn(x, x, s);
}
__device__ __forceinline__ float rmsnorm_rstd(float ss, int c, float eps) {
    return 1.0f / sqrtf(__fmaf_rn(ss, 1.0f / c, eps));
}
__device__ __forceinline__ float layernorm_mean(float s, int c) {
    return __fdiv_rn(s, (float)c);
}
__device__ __forceinline__ float ln_sq_add(float v, float x, float m) {
    float d = __fsub_rn(x, m);
    return __fmaf_rn(d, d, v);
}
__device__ __forceinline__ float layernorm_rstd(float vs, int c, float eps) {
    return 1.0f / sqrtf(__fadd_rn(__fdiv_rn(vs, (float)c), eps));
}

// RMSNorm: (x * rstd) * w.
__device__ __forceinline__ float rmsnorm_one(float x, float r, float w) {
    return __fmul_rn(__fmul_rn(x, r), w);
}

// LayerNorm: ((x - mean) * rstd) * w + b, the last product and sum fused.
__device__ __forceinline__ float layernorm_one(float x, float m, float r, float w, float b) {
    return __fmaf_rn(__fmul_rn(__fsub_rn(x, m), r), w, b);
}
