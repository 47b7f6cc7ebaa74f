// GELU, tanh approximation (GPT-2): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Forward and backward side by side; the caller keeps inp for the backward.
// Backward: dinp (=) = gelu'(inp) * dout. inp holds f32 values, or BF16 values with in_bf16 (fc1's
// output, a GEMM's, is BF16 and may be stored so); dout likewise with dout_bf16 (fc2's dgrad output).
#include "common.cuh"

#define GELU_SCALE 0.7978846f  // sqrt(2/pi)
#define GELU_CUBE 0.044715f

// Computed as the CPU reference does, through 0.5 (1 + tanh(a)) = sigmoid(2a): one expf.
extern "C" __global__ void gelu_fwd(float* __restrict__ out, const void* __restrict__ inp, int in_bf16, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float x = load_value(inp, i, in_bf16);
        float a = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        out[i] = x / (1.0f + expf(-2.0f * a));
    }
}

// dinp = (sig + 2 x sig (1 - sig) da/dx) * dout, sig = sigmoid(2a).
extern "C" __global__ void gelu_bwd(float* __restrict__ dinp, const void* __restrict__ inp, int in_bf16,
                                    const void* __restrict__ dout, int dout_bf16, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float x = load_value(inp, i, in_bf16);
        float x2 = x * x;
        float a = GELU_SCALE * (x + GELU_CUBE * x2 * x);
        float e = expf(-2.0f * a);
        float sig = 1.0f / (1.0f + e);
        float one_minus = e > 1.0f ? 1.0f - sig : e * sig;
        float da_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x2);
        dinp[i] = (sig + 2.0f * x * (sig * one_minus) * da_dx) * load_value(dout, i, dout_bf16);
    }
}
