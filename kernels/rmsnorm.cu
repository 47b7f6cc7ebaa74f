// RMSNorm over the last dimension C (Llama): out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), f32.
// Forward: out (N, C), and rstd (N) saved for backward.
// Backward: dinp (+=), dw (+=). dinp is one warp per row; dw is reduced over rows deterministically:
// rmsnorm_bwd_partial writes per-chunk column sums, rmsnorm_bwd_reduce adds the chunks in order.
// Nothing is rounded to BF16 (as in capture/src/layers/rmsnorm.rs, the CPU reference). dout holds f32
// values, or BF16 values with dout_bf16 (a dgrad GEMM's output, BF16 by construction, may be stored so).
#include "common.cuh"

// Launch: one warp per row (blockDim.x a multiple of 32).
extern "C" __global__ void rmsnorm_fwd(float* __restrict__ out, float* __restrict__ rstd,
                                       const float* __restrict__ inp, const float* __restrict__ w,
                                       int n, int c, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* x = inp + (u64)row * c;
    float s = 0.0f;
    for (int i = lane; i < c; i += 32) s += x[i] * x[i];
    float ms = warp_sum(s) * (1.0f / c);
    float r = 1.0f / sqrtf(ms + eps);
    float* o = out + (u64)row * c;
    for (int i = lane; i < c; i += 32) o[i] = x[i] * r * w[i];
    if (lane == 0) rstd[row] = r;
}

// dinp[row] += (w*dout - norm * mean(w*dout*norm)) * rstd, norm = x * rstd. Launch: one warp per row.
extern "C" __global__ void rmsnorm_bwd(float* __restrict__ dinp, const void* __restrict__ dout, int dout_bf16,
                                       const float* __restrict__ inp, const float* __restrict__ w,
                                       const float* __restrict__ rstd, int n, int c) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* x = inp + (u64)row * c;
    u64 g0 = (u64)row * c;
    float r = rstd[row];
    float a = 0.0f;
    for (int i = lane; i < c; i += 32) a += (w[i] * load_value(dout, g0 + i, dout_bf16)) * (x[i] * r);
    a = warp_sum(a) * (1.0f / c);
    float* d = dinp + (u64)row * c;
    for (int i = lane; i < c; i += 32) d[i] += (w[i] * load_value(dout, g0 + i, dout_bf16) - (x[i] * r) * a) * r;
}

// partial[chunk][col] = sum over the chunk's rows (in order) of dout * norm.
// Launch: grid (ceil(C / blockDim.x), n_chunks), rows_per_chunk rows each.
extern "C" __global__ void rmsnorm_bwd_partial(float* __restrict__ partial, const void* __restrict__ dout, int dout_bf16,
                                               const float* __restrict__ inp, const float* __restrict__ rstd,
                                               int n, int c, int rows_per_chunk) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (col >= c) return;
    float dw = 0.0f;
    int r1 = min(n, (chunk + 1) * rows_per_chunk);
    for (int row = chunk * rows_per_chunk; row < r1; row++) {
        u64 i = (u64)row * c + col;
        dw += load_value(dout, i, dout_bf16) * (inp[i] * rstd[row]);
    }
    partial[(u64)chunk * c + col] = dw;
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
