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

// The backward of both normalizations, one block a chunk of CHUNK rows (a warp a row, 32 CHUNK
// threads): dinp[row] += (w*dout - mean(w*dout) - norm * mean(w*dout*norm)) * rstd for LayerNorm
// (LN), norm = (x - mean) * rstd; dinp[row] += (w*dout - norm * mean(w*dout*norm)) * rstd for
// RMSNorm, norm = x * rstd; and partial[SUMS chunk + s][col] = the chunk's column sums, in row
// order, of dout * norm (s = 0, the gain's gradient) and, for LayerNorm, of dout (s = 1, the bias's).
// First each warp reduces its row's means (lane l adds columns l, l + 32, ... in order, then
// warp_sum); then each thread takes columns t, t + blockDim.x, ... down the chunk's rows, in order,
// writing dinp and summing its columns' gradients while the chunk's rows are still in the caches:
// one pass over dout and x for every gradient (they used to take two kernels, each reading both).
// The roundings are explicit: the ones the compiler chose for the two-kernel forms, so that the
// gradients are those bits whatever the schedule. dout holds f32 values, or BF16 values with
// dout_bf16 (a dgrad GEMM's output, BF16 by construction, may be stored so).
// AHEAD: rows whose values each thread loads at once in the column pass. The compiler does not
// move a row's loads above the row before's dinp store, and one row at a time left the loop waiting
// on memory; the 32 registers of two blocks an SM hold 4 rows for RMSNorm (8 spill) and 3 for
// LayerNorm (4 spill).
template <bool LN, int CHUNK, int AHEAD>
__device__ __forceinline__ void norm_bwd_chunk(float* __restrict__ dinp, float* __restrict__ partial, const void* __restrict__ dout,
                                               int dout_bf16, const float* __restrict__ inp, const float* __restrict__ w,
                                               const float* __restrict__ mean, const float* __restrict__ rstd, int n, int c) {
    // Per row of the chunk: the mean (LayerNorm), rstd, mean(w*dout) (LayerNorm) and mean(w*dout*norm).
    __shared__ float mean_s[CHUNK], rstd_s[CHUNK], a_s[CHUNK], b_s[CHUNK];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row0 = blockIdx.x * CHUNK;
    int rows = min(CHUNK, n - row0);
    if (warp < rows) {
        int row = row0 + warp;
        const float* x = inp + (u64)row * c;
        u64 g0 = (u64)row * c;
        float m = LN ? mean[row] : 0.0f, r = rstd[row];
        float a = 0.0f, b = 0.0f;
        for (int i = lane; i < c; i += 32) {
            float g = load_value(dout, g0 + i, dout_bf16);
            if (LN) {
                float dn = __fmul_rn(w[i], g);
                a = __fadd_rn(a, dn);
                b = __fmaf_rn(dn, __fmul_rn(__fsub_rn(x[i], m), r), b);
            } else {
                b = __fmaf_rn(__fmul_rn(r, x[i]), __fmul_rn(w[i], g), b);
            }
        }
        // warp_sum on every lane (a shuffle), the division once the sum is whole.
        float am = LN ? __fdiv_rn(warp_sum(a), (float)c) : 0.0f;
        float bm = LN ? __fdiv_rn(warp_sum(b), (float)c) : __fmul_rn(warp_sum(b), 1.0f / c);
        if (lane == 0) {
            mean_s[warp] = m;
            rstd_s[warp] = r;
            a_s[warp] = am;
            b_s[warp] = bm;
        }
    }
    __syncthreads();
    for (int col = threadIdx.x; col < c; col += blockDim.x) {
        float wc = w[col], dw = 0.0f, db = 0.0f;
        for (int k0 = 0; k0 < rows; k0 += AHEAD) {
            float g[AHEAD], xv[AHEAD], dv[AHEAD];
#pragma unroll
            for (int j = 0; j < AHEAD; j++) {
                u64 i = (u64)(row0 + k0 + j) * c + col;
                bool in = k0 + j < rows;
                g[j] = in ? load_value(dout, i, dout_bf16) : 0.0f;
                xv[j] = in ? inp[i] : 0.0f;
                dv[j] = in ? dinp[i] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < AHEAD; j++) {
                int k = k0 + j;
                if (k >= rows) break;
                float r = rstd_s[k], u, norm;
                if (LN) {
                    norm = __fmul_rn(__fsub_rn(xv[j], mean_s[k]), r);
                    u = __fmaf_rn(norm, -b_s[k], __fmaf_rn(wc, g[j], -a_s[k]));
                    db = __fadd_rn(db, g[j]);
                } else {
                    norm = __fmul_rn(r, xv[j]);
                    u = __fmaf_rn(wc, g[j], -__fmul_rn(b_s[k], norm));
                }
                dinp[(u64)(row0 + k) * c + col] = __fmaf_rn(r, u, dv[j]);
                dw = __fmaf_rn(norm, g[j], dw);
            }
        }
        partial[(u64)blockIdx.x * (LN ? 2 : 1) * c + col] = dw;
        if (LN) partial[((u64)blockIdx.x * 2 + 1) * c + col] = db;
    }
}

// The chunks' reduction: dw[col] += the sum over chunks of partial[SUMS chunk][col], and for
// LayerNorm (SUMS 2) db[col] += that of partial[SUMS chunk + 1][col]. A block takes 32 columns
// (a lane each) with NORM_REDUCE_WARPS warps: warp g adds chunks g, g + NORM_REDUCE_WARPS, ... in
// order, in f64, and warp 0 adds the warps' sums in order, adds that to dw (and db) and rounds
// once to f32: a fixed order (reruns are bit-identical), and a sum as exact as f64 makes it.
// Launch: ceil(C / 32) blocks of (32, NORM_REDUCE_WARPS) (capture/src/backend/cuda/rmsnorm.rs:
// norm_reduce_cfg). One thread a column adding the chunks in f32 took 46 µs a call at seed batch
// 32 (512 chunks, C = 1024: 8 blocks of 128 threads, too few loads in flight), 1.16 ms a step;
// staging the chunks through shared memory for one warp to add was slower still
// (bench/results/2026-12-02-norm-backward).
#define NORM_REDUCE_WARPS 16
template <int SUMS>
__device__ __forceinline__ void norm_bwd_reduce(float* __restrict__ dw, float* __restrict__ db, const float* __restrict__ partial,
                                                int c, int n_chunks) {
    __shared__ double sh[SUMS][NORM_REDUCE_WARPS][32];
    int lane = threadIdx.x, g = threadIdx.y;
    int col = blockIdx.x * 32 + lane;
    double a = 0.0, b = 0.0;
    if (col < c) {
#pragma unroll 4
        for (int k = g; k < n_chunks; k += NORM_REDUCE_WARPS) {
            a += (double)partial[((u64)k * SUMS) * c + col];
            if (SUMS == 2) b += (double)partial[((u64)k * 2 + 1) * c + col];
        }
    }
    sh[0][g][lane] = a;
    if (SUMS == 2) sh[SUMS - 1][g][lane] = b;
    __syncthreads();
    if (g != 0 || col >= c) return;
    double ta = 0.0, tb = 0.0;
    for (int k = 0; k < NORM_REDUCE_WARPS; k++) {
        ta += sh[0][k][lane];
        if (SUMS == 2) tb += sh[SUMS - 1][k][lane];
    }
    dw[col] = (float)((double)dw[col] + ta);
    if (SUMS == 2) db[col] = (float)((double)db[col] + tb);
}
