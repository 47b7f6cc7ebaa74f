// Reductions over whole tensors: sums of squares (the global gradient norm) and non-finite counts.
// Sums are deterministic: per-block partials in f64, then one fixed-order reduction.
#include "common.cuh"

// partials[blockIdx.x] = sum of x[i]^2 over this block's grid-stride share (f64).
// Launch: 256 threads, any grid.
extern "C" __global__ void sumsq_partial(const float* __restrict__ x, u64 n, double* __restrict__ partials) {
    __shared__ double sh[32];
    // Four independent loads in flight per thread; a fixed assignment of elements to threads.
    double acc = 0.0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        float a = __ldg(x + i), b = __ldg(x + i + stride), c = __ldg(x + i + 2 * stride), d = __ldg(x + i + 3 * stride);
        acc += (double)a * a;
        acc += (double)b * b;
        acc += (double)c * c;
        acc += (double)d * d;
    }
    for (; i < n; i += stride) {
        double v = (double)x[i];
        acc += v * v;
    }
    double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// *out = sum of partials[0..n] in a fixed order. Launch: one block of 256 threads.
extern "C" __global__ void sum_partials(const double* __restrict__ partials, u64 n, double* __restrict__ out) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
    double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) *out = s;
}

// *count += number of non-finite x[i] (integer atomics: order-independent).
extern "C" __global__ void count_nonfinite(const float* __restrict__ x, u64 n, u64* __restrict__ count) {
    u32 bad = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        if (!isfinite(x[i])) bad++;
    }
    bad = __reduce_add_sync(0xffffffffu, bad);
    if ((threadIdx.x & 31) == 0 && bad) atomicAdd(count, (u64)bad);
}
