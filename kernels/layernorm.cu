// LayerNorm over the last dimension C, eps 1e-5, f32.
// Forward: out (N, C), and mean (N), rstd (N) saved for backward; with out null, mean and rstd only
// (a cast that computes out as it reads x follows: cast.cu, SRC_LAYERNORM).
// Backward: dinp (+=), dw (+=), db (+=). dinp is one warp per row; dw and db are reduced over rows
// deterministically: layernorm_bwd_partial writes per-chunk column sums, layernorm_bwd_reduce adds
// the chunks in order.
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
// that computes the normalized out as it reads it (cast.cu: SRC_LAYERNORM).
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

// dinp[row] += (w*dout - mean(w*dout) - norm * mean(w*dout*norm)) * rstd. Launch: one warp per row.
extern "C" __global__ void layernorm_bwd(float* __restrict__ dinp, const void* __restrict__ dout, int dout_bf16,
                                         const float* __restrict__ inp, const float* __restrict__ w,
                                         const float* __restrict__ mean, const float* __restrict__ rstd,
                                         int n, int c) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float* x = inp + (u64)row * c;
    u64 g0 = (u64)row * c;
    float m = mean[row], r = rstd[row];
    float a = 0.0f, bsum = 0.0f;
    for (int i = lane; i < c; i += 32) {
        float norm = (x[i] - m) * r;
        float dn = w[i] * load_value(dout, g0 + i, dout_bf16);
        a += dn;
        bsum += dn * norm;
    }
    a = warp_sum(a) / c;
    bsum = warp_sum(bsum) / c;
    float* d = dinp + (u64)row * c;
    for (int i = lane; i < c; i += 32) {
        float norm = (x[i] - m) * r;
        float dn = w[i] * load_value(dout, g0 + i, dout_bf16);
        d[i] += (dn - a - norm * bsum) * r;
    }
}

// partial[chunk][0][col] = sum over the chunk's rows of norm*dout, partial[chunk][1][col] = of dout.
// Launch: grid (ceil(C / blockDim.x), n_chunks), rows_per_chunk rows each.
extern "C" __global__ void layernorm_bwd_partial(float* __restrict__ partial, const void* __restrict__ dout, int dout_bf16,
                                                 const float* __restrict__ inp, const float* __restrict__ mean,
                                                 const float* __restrict__ rstd, int n, int c, int rows_per_chunk) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (col >= c) return;
    float dw = 0.0f, db = 0.0f;
    int r1 = min(n, (chunk + 1) * rows_per_chunk);
    for (int row = chunk * rows_per_chunk; row < r1; row++) {
        u64 i = (u64)row * c + col;
        float norm = (inp[i] - mean[row]) * rstd[row];
        float g = load_value(dout, i, dout_bf16);
        dw += norm * g;
        db += g;
    }
    partial[((u64)chunk * 2) * c + col] = dw;
    partial[((u64)chunk * 2 + 1) * c + col] = db;
}

// dw[col] += sum over chunks (in order) of partial[chunk][0][col]; db likewise.
extern "C" __global__ void layernorm_bwd_reduce(float* __restrict__ dw, float* __restrict__ db,
                                                const float* __restrict__ partial, int c, int n_chunks) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    float a = 0.0f, b = 0.0f;
    for (int k = 0; k < n_chunks; k++) {
        a += partial[((u64)k * 2) * c + col];
        b += partial[((u64)k * 2 + 1) * c + col];
    }
    dw[col] += a;
    db[col] += b;
}
