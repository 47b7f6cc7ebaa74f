// SwiGLU (Llama's MLP gate): each row of inp (N, 2F) is [gate (F) | up (F)]; out (N, F) = silu(gate) * up,
// silu(g) = g * sigmoid(g). Forward and backward side by side; the caller keeps inp for the backward.
// Backward: dinp (N, 2F) (=): d(gate) = dout * up * silu'(gate), d(up) = dout * silu(gate), with
// silu'(g) = sig + g * sig * (1 - sig); the element math is activations.cuh's. Every output element
// is written by one thread, with the same operations whether it loads and stores 4 values at once
// (F a multiple of 4) or one by one. inp holds f32 values, or BF16 values with in_bf16 (fc1's
// output, a GEMM's, is BF16 and may be stored so); dout likewise with dout_bf16 (fc2's dgrad
// output).
#include "common.cuh"
#include "activations.cuh"

// v[0..4] to p + i (f32), as load4 reads.
__device__ __forceinline__ void store4(float* __restrict__ p, u64 i, bool vec, int valid, const float (&v)[4]) {
    if (vec) {
        *(float4*)(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
        for (int k = 0; k < valid; k++) p[i + k] = v[k];
    }
}

// Whether 4-wide loads and stores fit: F a multiple of 4 and every base pointer aligned for them.
__device__ __forceinline__ bool vec_ok(int f, const void* a, int a_bf16, const void* b, int b_bf16, const float* o) {
    return (f & 3) == 0 && aligned4(a, a_bf16) && aligned4(b, b_bf16) && aligned4(o, 0);
}

// Both kernels: each thread takes 4 consecutive elements j..j+3 of a row of the (N, F) side.
// Launch: grid (ceil(F / (4 blockDim.x)), rows), striding over the N rows by gridDim.y.
extern "C" __global__ void swiglu_fwd(float* __restrict__ out, const void* __restrict__ inp, int in_bf16, u64 n, int f) {
    int j = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (j >= f) return;
    bool vec = vec_ok(f, inp, in_bf16, inp, in_bf16, out);
    int valid = min(4, f - j);
    for (u64 row = blockIdx.y; row < n; row += gridDim.y) {
        float g[4], u[4], o[4];
        load4(inp, row * 2 * f + j, in_bf16, vec, valid, g);
        load4(inp, row * 2 * f + f + j, in_bf16, vec, valid, u);
#pragma unroll
        for (int k = 0; k < 4; k++) o[k] = swiglu_one(g[k], u[k]);
        store4(out, row * f + j, vec, valid, o);
    }
}

// Writes d(gate) and d(up) of each of its elements.
extern "C" __global__ void swiglu_bwd(float* __restrict__ dinp, const void* __restrict__ inp, int in_bf16,
                                      const void* __restrict__ dout, int dout_bf16, u64 n, int f) {
    int j = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (j >= f) return;
    bool vec = vec_ok(f, inp, in_bf16, dout, dout_bf16, dinp);
    int valid = min(4, f - j);
    for (u64 row = blockIdx.y; row < n; row += gridDim.y) {
        u64 gi = row * 2 * f + j;
        float g[4], u[4], dy[4], dg[4], du[4];
        load4(inp, gi, in_bf16, vec, valid, g);
        load4(inp, gi + f, in_bf16, vec, valid, u);
        load4(dout, row * f + j, dout_bf16, vec, valid, dy);
#pragma unroll
        for (int k = 0; k < 4; k++) dswiglu_one(g[k], u[k], dy[k], dg[k], du[k]);
        store4(dinp, gi, vec, valid, dg);
        store4(dinp, gi + f, vec, valid, du);
    }
}
