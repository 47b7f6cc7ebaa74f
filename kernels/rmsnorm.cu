// RMSNorm over the last dimension C (Llama): out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), f32.
// Forward: out (N, C), and rstd (N) saved for backward; with out null, rstd only (a cast that
// computes out as it reads x follows: cast_src.cuh, SRC_RMSNORM).
// Backward: dinp (+=) and dw (+=), deterministically: rmsnorm_bwd takes a chunk of RMS_CHUNK rows
// per block, computes dinp and writes the chunk's column sums of dout * norm; rmsnorm_bwd_reduce
// adds the chunks in a fixed order, in f64 (the kernels are LayerNorm's too: norms.cuh). One pass
// over dout and x for both gradients (they used to take two kernels, each reading both: 141 µs a
// call at llama-1b's 8192 x 2048). Nothing is rounded to BF16 (as in capture/src/layers/rmsnorm.rs,
// the CPU reference).
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
// out as it reads it (cast_src.cuh: SRC_RMSNORM).
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

// dinp[row] += (w*dout - norm * mean(w*dout*norm)) * rstd, norm = x * rstd, and partial[chunk][col] =
// the sum over the chunk's rows, in order, of dout * norm (norms.cuh: norm_bwd_chunk).
extern "C" __global__ void __launch_bounds__(32 * RMS_CHUNK, 2)
    rmsnorm_bwd(float* __restrict__ dinp, float* __restrict__ partial, const void* __restrict__ dout, int dout_bf16,
                const float* __restrict__ inp, const float* __restrict__ w, const float* __restrict__ rstd, int n, int c) {
    norm_bwd_chunk<false, RMS_CHUNK, 4>(dinp, partial, dout, dout_bf16, inp, w, nullptr, rstd, n, c);
}

// dw[col] += the sum over chunks of partial[chunk][col], in f64 in a fixed order (norms.cuh:
// norm_bwd_reduce, which gives the launch).
extern "C" __global__ void rmsnorm_bwd_reduce(float* __restrict__ dw, const float* __restrict__ partial,
                                              int c, int n_chunks) {
    norm_bwd_reduce<1>(dw, nullptr, partial, c, n_chunks);
}
