// RMSNorm over the last dimension C (Llama): out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), f32.
// Forward: out (N, C), and rstd (N) saved for backward; with out null, rstd only (a cast that
// computes out as it reads x follows: cast.cu, SRC_RMSNORM).
// Backward: dinp (+=) and dw (+=), deterministically: rmsnorm_bwd takes a chunk of RMS_CHUNK rows
// per block, computes dinp and writes the chunk's column sums of dout * norm; rmsnorm_bwd_reduce
// adds the chunks in order. One pass over dout and x for both gradients (they used to take two
// kernels, each reading both: 141 µs a call at llama-1b's 8192 x 2048).
// Nothing is rounded to BF16 (as in capture/src/layers/rmsnorm.rs, the CPU reference). dout holds f32
// values, or BF16 values with dout_bf16 (a dgrad GEMM's output, BF16 by construction, may be stored so).
// The products are written with explicit roundings (__fmul_rn, __fmaf_rn), the ones the compiler
// chose for the two-kernel form, so that the gradients are those bits whatever the schedule.
#include "common.cuh"
#include "norms.cuh"

// Launch: one warp per row (blockDim.x a multiple of 32).
extern "C" __global__ void rmsnorm_fwd(float* __restrict__ out, float* __restrict__ rstd,
                                       const float* __restrict__ inp, const float* __restrict__ w,
                                       int n, int c, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* x = inp + (u64)row * c;
    float s = 0.0f;
    for (int i = lane; i < c; i += 32) s = rms_sq_add(s, x[i]);
    float r = rmsnorm_rstd(warp_sum(s), c, eps);
    if (out != nullptr) {
        float* o = out + (u64)row * c;
        for (int i = lane; i < c; i += 32) o[i] = rmsnorm_one(x[i], r, w[i]);
    }
    if (lane == 0) rstd[row] = r;
}

// out = a + b (the residual add, b f32 or BF16 as in residual.cu) and rstd of out, one warp per
// row: residual_fwd's add and rmsnorm_fwd's statistics, the same operations in the same order, in
// one pass (the statistics without a second read of out), for a cast that computes the normalized
// out as it reads it (cast.cu: SRC_RMSNORM).
extern "C" __global__ void rmsnorm_add_stats(float* __restrict__ out, float* __restrict__ rstd,
                                             const float* __restrict__ a, const void* __restrict__ b, int b_bf16,
                                             int n, int c, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    u64 base = (u64)row * c;
    float s = 0.0f;
    for (int i = lane; i < c; i += 32) {
        float x = a[base + i] + load_value(b, base + i, b_bf16);
        out[base + i] = x;
        s = rms_sq_add(s, x);
    }
    float r = rmsnorm_rstd(warp_sum(s), c, eps);
    if (lane == 0) rstd[row] = r;
}

// Rows per block of rmsnorm_bwd, a warp each (capture/src/backend/cuda/rmsnorm.rs: RMS_CHUNK).
#define RMS_CHUNK 32
// Rows whose values each thread loads at once in rmsnorm_bwd's column pass.
#define RMS_AHEAD 4

// dinp[row] += (w*dout - norm * mean(w*dout*norm)) * rstd, norm = x * rstd, and partial[chunk][col] =
// the sum over the chunk's rows, in order, of dout * norm. Block b takes rows RMS_CHUNK b ..
// + RMS_CHUNK - 1 (RMS_CHUNK warps, 32 RMS_CHUNK threads). First each warp reduces its row's
// mean(w*dout*norm) (lane l adds columns l, l + 32, ... in order, then a butterfly); then each
// thread takes columns t, t + blockDim.x, ... down the chunk's rows, in order, writing dinp and
// summing its columns' dw, while the chunk's rows are still in the caches.
extern "C" __global__ void __launch_bounds__(32 * RMS_CHUNK, 2)
    rmsnorm_bwd(float* __restrict__ dinp, float* __restrict__ partial, const void* __restrict__ dout, int dout_bf16,
                const float* __restrict__ inp, const float* __restrict__ w, const float* __restrict__ rstd, int n, int c) {
    __shared__ float mean_s[RMS_CHUNK], rstd_s[RMS_CHUNK];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row0 = blockIdx.x * RMS_CHUNK;
    int rows = min(RMS_CHUNK, n - row0);
    if (warp < rows) {
        int row = row0 + warp;
        const float* x = inp + (u64)row * c;
        u64 g0 = (u64)row * c;
        float r = rstd[row];
        float a = 0.0f;
        for (int i = lane; i < c; i += 32) a = __fmaf_rn(__fmul_rn(r, x[i]), __fmul_rn(w[i], load_value(dout, g0 + i, dout_bf16)), a);
        a = __fmul_rn(warp_sum(a), 1.0f / c);
        if (lane == 0) {
            mean_s[warp] = a;
            rstd_s[warp] = r;
        }
    }
    __syncthreads();
    for (int col = threadIdx.x; col < c; col += blockDim.x) {
        float wc = w[col], dw = 0.0f;
        // RMS_AHEAD rows' loads at once: the compiler does not move a row's loads above the row
        // before's dinp store, and one row at a time left the loop waiting on memory (117 µs a
        // llama-1b call). 4 fit the 32 registers of two blocks an SM; 8 spill there.
        for (int k0 = 0; k0 < rows; k0 += RMS_AHEAD) {
            float g[RMS_AHEAD], xv[RMS_AHEAD], dv[RMS_AHEAD];
#pragma unroll
            for (int j = 0; j < RMS_AHEAD; j++) {
                u64 i = (u64)(row0 + k0 + j) * c + col;
                bool in = k0 + j < rows;
                g[j] = in ? load_value(dout, i, dout_bf16) : 0.0f;
                xv[j] = in ? inp[i] : 0.0f;
                dv[j] = in ? dinp[i] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < RMS_AHEAD; j++) {
                int k = k0 + j;
                if (k >= rows) break;
                float xr = __fmul_rn(rstd_s[k], xv[j]);
                float u = __fmaf_rn(wc, g[j], -__fmul_rn(mean_s[k], xr));
                dinp[(u64)(row0 + k) * c + col] = __fmaf_rn(rstd_s[k], u, dv[j]);
                dw = __fmaf_rn(xr, g[j], dw);
            }
        }
        partial[(u64)blockIdx.x * c + col] = dw;
    }
}

// dw[col] += sum over chunks (in order) of partial[chunk][col]. Launch: ceil(C / blockDim.x) blocks.
extern "C" __global__ void rmsnorm_bwd_reduce(float* __restrict__ dw, const float* __restrict__ partial,
                                              int c, int n_chunks) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    float a = 0.0f;
    for (int k = 0; k < n_chunks; k++) a += partial[(u64)k * c + col];
    dw[col] += a;
}
