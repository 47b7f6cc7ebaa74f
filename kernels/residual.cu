// Residual stream. Forward: out = a + b. Backward of a residual add is the identity; `add_inplace`
// (acc += x) serves gradient accumulation. b holds f32 values, or BF16 values with b_bf16 (the
// branch added to the stream is a GEMM's output, BF16 by construction, and may be stored so).
#include "common.cuh"

extern "C" __global__ void residual_fwd(float* __restrict__ out, const float* __restrict__ a,
                                        const void* __restrict__ b, int b_bf16, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        out[i] = a[i] + load_value(b, i, b_bf16);
    }
}

extern "C" __global__ void residual_bwd(float* __restrict__ acc, const float* __restrict__ x, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        acc[i] += x[i];
    }
}
