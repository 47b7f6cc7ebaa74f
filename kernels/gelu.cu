// GELU, tanh approximation (GPT-2): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Forward and backward side by side; the caller keeps inp for the backward.
// Backward: dinp (=) = gelu'(inp) * dout. inp holds f32 values, or BF16 values with in_bf16 (fc1's
// output, a GEMM's, is BF16 and may be stored so); dout likewise with dout_bf16 (fc2's dgrad output).
#include "common.cuh"
#include "activations.cuh"

// The element math is activations.cuh's (gelu_one, dgelu_one), computed as the CPU reference does.
extern "C" __global__ void gelu_fwd(float* __restrict__ out, const void* __restrict__ inp, int in_bf16, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        out[i] = gelu_one(load_value(inp, i, in_bf16));
    }
}

// dinp = (sig + 2 x sig (1 - sig) da/dx) * dout, sig = sigmoid(2a).
extern "C" __global__ void gelu_bwd(float* __restrict__ dinp, const void* __restrict__ inp, int in_bf16,
                                    const void* __restrict__ dout, int dout_bf16, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dinp[i] = dgelu_one(load_value(inp, i, in_bf16), load_value(dout, i, dout_bf16));
    }
}
