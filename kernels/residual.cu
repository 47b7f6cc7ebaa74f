// Residual stream. Forward: out = a + b. Backward of a residual add is the identity; `add_inplace`
// (acc += x) serves gradient accumulation.
#include "common.cuh"

extern "C" __global__ void residual_fwd(float* __restrict__ out, const float* __restrict__ a,
                                        const float* __restrict__ b, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        out[i] = a[i] + b[i];
    }
}

extern "C" __global__ void residual_bwd(float* __restrict__ acc, const float* __restrict__ x, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        acc[i] += x[i];
    }
}
