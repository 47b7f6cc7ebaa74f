// LayerNorm over the last dimension C, eps 1e-5, f32.
// Forward: out (N, C), and mean (N), rstd (N) saved for backward; with out null, mean and rstd only
// (a cast that computes out as it reads x follows: cast_src.cuh, SRC_LAYERNORM).
// Backward: dinp (+=), dw (+=), db (+=), deterministically: layernorm_bwd takes a chunk of LN_CHUNK
// rows per block, computes dinp and writes the chunk's column sums of dout * norm and dout;
// layernorm_bwd_reduce adds the chunks in a fixed order, in f64 (the kernels are RMSNorm's too:
// norms.cuh). One pass over dout and x for all three gradients (they used to take two kernels, each
// reading both: 166 µs a call at seed batch 32's 16384 x 1024).
#include "common.cuh"
#include "norms.cuh"

#define LN_EPS 1e-5f

// Launch: one warp per row (blockDim.x a multiple of 32).
extern "C" __global__ void layernorm_fwd(float* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                         const float* __restrict__ inp, const float* __restrict__ w,
                                         const float* __restrict__ b, int n, int c) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* x = inp + (u64)row * c;
    float s = 0.0f;
    for (int i = lane; i < c; i += 32) s += x[i];
    float m = layernorm_mean(warp_sum(s), c);
    float v = 0.0f;
    for (int i = lane; i < c; i += 32) v = ln_sq_add(v, x[i], m);
    float r = layernorm_rstd(warp_sum(v), c, LN_EPS);
    if (out != nullptr) {
        float* o = out + (u64)row * c;
        for (int i = lane; i < c; i += 32) o[i] = layernorm_one(x[i], m, r, w[i], b[i]);
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// out = a + b (the residual add, b f32 or BF16 as in residual.cu) and mean, rstd of out, one warp
// per row: residual_fwd's add and layernorm_fwd's statistics, the same operations in the same
// order, the variance pass reading back the row the warp just wrote (from the caches), for a cast
// that computes the normalized out as it reads it (cast_src.cuh: SRC_LAYERNORM).
extern "C" __global__ void layernorm_add_stats(float* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                               const float* __restrict__ a, const void* __restrict__ b, int b_bf16,
                                               int n, int c) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    u64 base = (u64)row * c;
    float* x = out + base;
    float s = 0.0f;
    for (int i = lane; i < c; i += 32) {
        float y = a[base + i] + load_value(b, base + i, b_bf16);
        x[i] = y;
        s += y;
    }
    float m = layernorm_mean(warp_sum(s), c);
    float v = 0.0f;
    for (int i = lane; i < c; i += 32) v = ln_sq_add(v, x[i], m);
    float r = layernorm_rstd(warp_sum(v), c, LN_EPS);
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// Rows per block of layernorm_bwd, a warp each (capture/src/backend/cuda/layernorm.rs: LN_CHUNK).
#define LN_CHUNK 32

// dinp[row] += (w*dout - mean(w*dout) - norm * mean(w*dout*norm)) * rstd, norm = (x - mean) * rstd,
// and partial[2 chunk][col], partial[2 chunk + 1][col] = the sums over the chunk's rows, in order,
// of dout * norm and of dout (norms.cuh: norm_bwd_chunk).
extern "C" __global__ void __launch_bounds__(32 * LN_CHUNK, 2)
    layernorm_bwd(float* __restrict__ dinp, float* __restrict__ partial, const void* __restrict__ dout, int dout_bf16,
                  const float* __restrict__ inp, const float* __restrict__ w, const float* __restrict__ mean,
                  const float* __restrict__ rstd, int n, int c) {
    norm_bwd_chunk<true, LN_CHUNK, 3>(dinp, partial, dout, dout_bf16, inp, w, mean, rstd, n, c);
}

// dw[col] += the sum over chunks of partial[2 chunk][col]; db likewise from partial[2 chunk + 1]; in
// f64 in a fixed order (norms.cuh: norm_bwd_reduce, which gives the launch).
extern "C" __global__ void layernorm_bwd_reduce(float* __restrict__ dw, float* __restrict__ db,
                                                const float* __restrict__ partial, int c, int n_chunks) {
    norm_bwd_reduce<2>(dw, db, partial, c, n_chunks);
}
