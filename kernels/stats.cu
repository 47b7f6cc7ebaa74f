// Reductions over whole tensors: sums of squares (the global gradient norm), non-finite counts, and
// the per-channel statistics of GEMM operands (channel_stats_*, below); and the zeroing of the
// gradients that accumulate (zero_multi), which walks the same multi-tensor tables.
// Sums are deterministic: per-block partials in f64, then one fixed-order reduction.
#include "common.cuh"

// Σ x[i]^2 (f64) over the elements t, t + stride, t + 2 stride, ... of x, in that order, with 16
// loads in flight (a BF16 weight gradient is 2 bytes a value: 4 in flight kept too few bytes moving
// to reach the memory's bandwidth). Each square of an f32 is exact in f64, so the order of the sum is
// the only thing that fixes its bits, and it is the same however many loads are in flight.
__device__ __forceinline__ double sumsq_share(const void* __restrict__ x, int x_bf16, u64 n, u64 t, u64 stride) {
    double acc = 0.0;
    u64 i = t;
    for (; i + 15 * stride < n; i += 16 * stride) {
        float w[16];
#pragma unroll
        for (int k = 0; k < 16; k++) w[k] = load_value(x, i + k * stride, x_bf16);
#pragma unroll
        for (int k = 0; k < 16; k++) acc += (double)w[k] * w[k];
    }
    for (; i < n; i += stride) {
        double v = (double)load_value(x, i, x_bf16);
        acc += v * v;
    }
    return acc;
}

// partials[blockIdx.x] = sum of x[i]^2 over this block's grid-stride share (f64). x holds f32
// values, or BF16 values with x_bf16 (a weight gradient, assigned by its wgrad GEMM, may be).
// Launch: 256 threads, any grid.
extern "C" __global__ void sumsq_partial(const void* __restrict__ x, int x_bf16, u64 n, double* __restrict__ partials) {
    __shared__ double sh[32];
    double acc = sumsq_share(x, x_bf16, n, blockIdx.x * (u64)blockDim.x + threadIdx.x, (u64)gridDim.x * blockDim.x);
    double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// sumsq_partial over every buffer of a multi-tensor table (common.cuh: mt_entry; pointer x) in one
// launch: block b writes partials[b], the partial that block b - first of a launch of sumsq_partial
// over that buffer alone, with the entry's blocks as its grid, would have written. Launch: 256
// threads.
extern "C" __global__ void sumsq_multi(const u64* __restrict__ table, int count, double* __restrict__ partials) {
    __shared__ double sh[32];
    const u64* e = mt_entry(table, count, blockIdx.x);
    u64 first = __ldg(e + MT_START), blocks = __ldg(e + MT_BLOCKS), n = __ldg(e + MT_N), flags = __ldg(e + MT_FLAGS);
    const void* x = reinterpret_cast<const void*>(__ldg(e + MT_PTR));
    double acc = sumsq_share(x, (int)(flags & 1), n, (blockIdx.x - first) * blockDim.x + threadIdx.x, blocks * blockDim.x);
    double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// Zeroes every buffer of a multi-tensor table (pointer x; MT_N its 4-byte words), 16 bytes a store
// where the buffer is aligned for it: the gradients that accumulate, all in one launch at the start
// of a step. Launch: any block size.
extern "C" __global__ void zero_multi(const u64* __restrict__ table, int count) {
    const u64* e = mt_entry(table, count, blockIdx.x);
    u64 first = __ldg(e + MT_START), blocks = __ldg(e + MT_BLOCKS), n = __ldg(e + MT_N);
    float* x = reinterpret_cast<float*>(__ldg(e + MT_PTR));
    u64 t = (blockIdx.x - first) * blockDim.x + threadIdx.x, stride = blocks * blockDim.x;
    u64 n4 = ((u64)x & 15) == 0 ? n / 4 : 0;
    for (u64 i = t; i < n4; i += stride) reinterpret_cast<float4*>(x)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (u64 i = 4 * n4 + t; i < n; i += stride) x[i] = 0.0f;
}

// *out = sum of partials[0..n] in a fixed order. Launch: one block of 256 threads.
extern "C" __global__ void sum_partials(const double* __restrict__ partials, u64 n, double* __restrict__ out) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
    double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) *out = s;
}

// *count += number of non-finite x[i] (integer atomics: order-independent); x f32, or BF16 with x_bf16.
extern "C" __global__ void count_nonfinite(const void* __restrict__ x, int x_bf16, u64 n, u64* __restrict__ count) {
    u32 bad = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        if (!isfinite(load_value(x, i, x_bf16))) bad++;
    }
    bad = __reduce_add_sync(0xffffffffu, bad);
    if ((threadIdx.x & 31) == 0 && bad) atomicAdd(count, (u64)bad);
}

// The error of a GEMM's FP8 result against its BF16 shadow on the same inputs (dump steps), summed
// on the device instead of downloading both outputs: per block, over the pairs whose values are both
// finite (test f32, or BF16 with test_bf16; ref f32), in grid-stride order,
// partials[blockIdx.x * 8 + k] = sum (t - r)^2, sum t r, sum t^2, sum r^2, max |t - r|, pairs,
// non-finite test values, sum (t - r) r (a gradient GEMM's error paired with its BF16 result, its
// dual) (f64, fixed order). The host adds the blocks in order (backend/cuda/shadow_error.rs; the CPU
// references are tensor_stats::output_error and error_inner).
// Launch: 256 threads, any grid.
__device__ __forceinline__ double warp_max_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
extern "C" __global__ void output_error_partial(const void* __restrict__ test, int test_bf16, const float* __restrict__ ref, u64 n,
                                                double* __restrict__ partials) {
    __shared__ double sh[32];
    double d2 = 0.0, dot = 0.0, t2 = 0.0, r2 = 0.0, mx = 0.0, pairs = 0.0, bad = 0.0, inner = 0.0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float tf = load_value(test, i, test_bf16), rf = ref[i];
        if (!isfinite(tf)) bad += 1.0;
        if (!isfinite(tf) || !isfinite(rf)) continue;
        double t = tf, r = rf, d = t - r;
        d2 += d * d;
        dot += t * r;
        t2 += t * t;
        r2 += r * r;
        mx = fmax(mx, fabs(d));
        pairs += 1.0;
        inner += d * r;
    }
    double* out = partials + (u64)blockIdx.x * 8;
    double sums[7] = {d2, dot, t2, r2, pairs, bad, inner};
    const int at[7] = {0, 1, 2, 3, 5, 6, 7};
    for (int k = 0; k < 7; k++) {
        double s = block_sum_d(sums[k], sh);
        if (threadIdx.x == 0) out[at[k]] = s;
    }
    // The block's max: each warp's, then warp 0 over them.
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    mx = warp_max_d(mx);
    __syncthreads();
    if (lane == 0) sh[warp] = mx;
    __syncthreads();
    if (warp == 0) {
        double m = warp_max_d(lane < nw ? sh[lane] : 0.0);
        if (lane == 0) out[4] = m;
    }
}

// Per-channel statistics of a GEMM operand x (rows x cols f32, row-major; a channel is a column),
// over finite values, with the planted outlier fault applied as the cast kernels apply it (the
// elements o0..o3 times outlier_factor, when it is not 1): sum of x^2 (f64) and max |x| (-inf for a
// channel without a finite value). Deterministic without atomics: one thread per (column, chunk
// of rows) sums its rows in order, then one thread per column adds the chunks in order.
//
// channel_stats_partial: grid (ceil(cols / blockDim.x), chunks), any blockDim.x; chunk y covers
// rows [y * rows_per_chunk, min(rows, (y + 1) * rows_per_chunk)). Threads of a warp read adjacent
// columns of one row (coalesced). Writes sq_part[y * cols + c], amax_part[y * cols + c].
extern "C" __global__ void channel_stats_partial(const float* __restrict__ x, int rows, int cols, int rows_per_chunk,
                                                 u64 o0, u64 o1, u64 o2, u64 o3, float outlier_factor,
                                                 double* __restrict__ sq_part, float* __restrict__ amax_part) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    int r0 = blockIdx.y * rows_per_chunk;
    int r1 = min(rows, r0 + rows_per_chunk);
    double s = 0.0;
    float m = -INFINITY;
#pragma unroll 4
    for (int r = r0; r < r1; r++) {
        u64 i = (u64)r * cols + c;
        float v = __ldg(x + i);
        if (outlier_factor != 1.0f && (i == o0 || i == o1 || i == o2 || i == o3)) v *= outlier_factor;
        if (isfinite(v)) {
            s += (double)v * (double)v;
            m = fmaxf(m, fabsf(v));
        }
    }
    sq_part[(u64)blockIdx.y * cols + c] = s;
    amax_part[(u64)blockIdx.y * cols + c] = m;
}

// channel_stats_reduce: for each job of a batch (the pending casts of a step, reduced together so
// that a step launches a few of these instead of one per recorded cast), sq[c] = the sum over chunks
// (in chunk order) of sq_part, amax[c] = their max. One thread per (job, column): the jobs' columns
// are numbered one after another (col_start). Each thread takes CHAN_LOADS chunks a round, their
// loads written ahead of the adds (ptxas keeps about four in flight), and adds them in chunk order:
// the sum of one sequential loop. The partials come from earlier launches, so they are read through
// the read-only path. Launch: grid ceil(col_start[n] / blockDim.x), any blockDim.x.
#define CHAN_BATCH 32
#define CHAN_LOADS 8
struct ChanJob {
    const double* sq_part;
    const float* amax_part;
    double* sq;
    float* amax;
    int chunks, cols;
};
struct ChanBatch {
    ChanJob job[CHAN_BATCH];
    int n;
    int col_start[CHAN_BATCH + 1];
};
extern "C" __global__ void channel_stats_reduce(const ChanBatch b) {
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= b.col_start[b.n]) return;
    // The thread's job, by constant indices only (the batch stays in the parameter bank).
    ChanJob t = b.job[0];
    int start = 0;
#pragma unroll
    for (int k = 1; k < CHAN_BATCH; k++) {
        if (k < b.n && g >= b.col_start[k]) {
            t = b.job[k];
            start = b.col_start[k];
        }
    }
    int c = g - start;
    double s = 0.0;
    float m = -INFINITY;
    int y = 0;
    for (; y + CHAN_LOADS <= t.chunks; y += CHAN_LOADS) {
        double ps[CHAN_LOADS];
        float pm[CHAN_LOADS];
#pragma unroll
        for (int k = 0; k < CHAN_LOADS; k++) {
            ps[k] = __ldg(t.sq_part + (u64)(y + k) * t.cols + c);
            pm[k] = __ldg(t.amax_part + (u64)(y + k) * t.cols + c);
        }
#pragma unroll
        for (int k = 0; k < CHAN_LOADS; k++) {
            s += ps[k];
            m = fmaxf(m, pm[k]);
        }
    }
    for (; y < t.chunks; y++) {
        s += __ldg(t.sq_part + (u64)y * t.cols + c);
        m = fmaxf(m, __ldg(t.amax_part + (u64)y * t.cols + c));
    }
    t.sq[c] = s;
    t.amax[c] = m;
}
