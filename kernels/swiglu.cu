// SwiGLU (Llama's MLP gate): each row of inp (N, 2F) is [gate (F) | up (F)]; out (N, F) = silu(gate) * up,
// silu(g) = g * sigmoid(g). Forward and backward side by side; the caller keeps inp for the backward.
// Backward: dinp (N, 2F) (=): d(gate) = dout * up * silu'(gate), d(up) = dout * silu(gate), with
// silu'(g) = sig + g * sig * (1 - sig). As in capture/src/layers/swiglu.rs: one expf, 1 - sig without
// cancellation, nothing rounded to BF16. Every output element is written by one thread. inp holds
// f32 values, or BF16 values with in_bf16 (fc1's output, a GEMM's, is BF16 and may be stored so);
// dout likewise with dout_bf16 (fc2's dgrad output).
#include "common.cuh"

// sig = 1 / (1 + e^-g); *one_minus = 1 - sig, taken as e * sig where that avoids the cancellation.
__device__ __forceinline__ float swiglu_sigmoid(float g, float* one_minus) {
    float e = expf(-g);
    float sig = 1.0f / (1.0f + e);
    *one_minus = e > 1.0f ? 1.0f - sig : e * sig;
    return sig;
}

// Launch: grid-stride over N*F outputs.
extern "C" __global__ void swiglu_fwd(float* __restrict__ out, const void* __restrict__ inp, int in_bf16, u64 n, int f) {
    u64 total = n * (u64)f;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 row = i / f;
        int j = (int)(i % f);
        float g = load_value(inp, row * 2 * f + j, in_bf16);
        float u = load_value(inp, row * 2 * f + f + j, in_bf16);
        float om;
        float sig = swiglu_sigmoid(g, &om);
        out[i] = (g * sig) * u;
    }
}

// Launch: grid-stride over N*F; thread i writes d(gate) and d(up) of output element i.
extern "C" __global__ void swiglu_bwd(float* __restrict__ dinp, const void* __restrict__ inp, int in_bf16,
                                      const void* __restrict__ dout, int dout_bf16, u64 n, int f) {
    u64 total = n * (u64)f;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 row = i / f;
        int j = (int)(i % f);
        u64 gi = row * 2 * f + j;
        float g = load_value(inp, gi, in_bf16);
        float u = load_value(inp, gi + f, in_bf16);
        float dy = load_value(dout, i, dout_bf16);
        float om;
        float sig = swiglu_sigmoid(g, &om);
        float dsilu = sig + g * sig * om;
        dinp[gi] = (dy * u) * dsilu;
        dinp[gi + f] = dy * (g * sig);
    }
}
