// SwiGLU (Llama's MLP gate): each row of inp (N, 2F) is [gate (F) | up (F)]; out (N, F) = silu(gate) * up,
// silu(g) = g * sigmoid(g). Forward and backward side by side; the caller keeps inp for the backward.
// Backward: dinp (N, 2F) (=): d(gate) = dout * up * silu'(gate), d(up) = dout * silu(gate), with
// silu'(g) = sig + g * sig * (1 - sig). As in capture/src/layers/swiglu.rs: one expf, 1 - sig without
// cancellation, nothing rounded to BF16. Every output element is written by one thread, with the
// same operations whether it loads and stores 4 values at once (F a multiple of 4) or one by one. inp holds
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

// Values i..i+3 of p (f32, or BF16 with bf16) into v; `vec` (vec_ok, and i a multiple of 4): one
// 16-byte (f32) or 8-byte (BF16) load reads them; else `valid` of them, one by one.
__device__ __forceinline__ void load4(const void* __restrict__ p, u64 i, int bf16, bool vec, int valid, float (&v)[4]) {
    if (vec && bf16) {
        uint2 w = __ldg((const uint2*)((const unsigned short*)p + i));
        v[0] = __uint_as_float(w.x << 16);
        v[1] = __uint_as_float(w.x & 0xffff0000u);
        v[2] = __uint_as_float(w.y << 16);
        v[3] = __uint_as_float(w.y & 0xffff0000u);
    } else if (vec) {
        float4 w = __ldg((const float4*)((const float*)p + i));
        v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
    } else {
        for (int k = 0; k < 4; k++) v[k] = k < valid ? load_value(p, i + k, bf16) : 0.0f;
    }
}

// v[0..4] to p + i (f32), as load4 reads.
__device__ __forceinline__ void store4(float* __restrict__ p, u64 i, bool vec, int valid, const float (&v)[4]) {
    if (vec) {
        *(float4*)(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
        for (int k = 0; k < valid; k++) p[i + k] = v[k];
    }
}

// Whether 4-wide loads and stores fit: F a multiple of 4 and every base pointer aligned for them.
__device__ __forceinline__ bool vec_ok(int f, const void* a, int a_bf16, const void* b, int b_bf16, const void* o) {
    u64 mis = ((u64)a & (a_bf16 ? 7 : 15)) | ((u64)b & (b_bf16 ? 7 : 15)) | ((u64)o & 15);
    return (f & 3) == 0 && mis == 0;
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
        for (int k = 0; k < 4; k++) {
            float om;
            float sig = swiglu_sigmoid(g[k], &om);
            o[k] = (g[k] * sig) * u[k];
        }
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
        for (int k = 0; k < 4; k++) {
            float om;
            float sig = swiglu_sigmoid(g[k], &om);
            float dsilu = sig + g[k] * sig * om;
            dg[k] = (dy[k] * u[k]) * dsilu;
            du[k] = dy[k] * (g[k] * sig);
        }
        store4(dinp, gi, vec, valid, dg);
        store4(dinp, gi + f, vec, valid, du);
    }
}
