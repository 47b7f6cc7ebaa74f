// The element math of the activation functions between fc1 and fc2 (SwiGLU for Llama, GELU for
// GPT), forward and backward, and a 4-wide loader of their inputs. One definition for the kernels
// that write the activations (swiglu.cu, gelu.cu) and the casts that compute them as they read
// them (cast.cu, cast_src_*), so both produce the same bits. The loader
// (capture/src/backend/cuda/kernels.rs) pastes this file in place of `#include "activations.cuh"`,
// after common.cuh. As the CPU reference (capture/src/layers/swiglu.rs, gelu.rs): one expf per
// element, 1 - sigmoid without cancellation, nothing rounded to BF16.
#pragma once

#define GELU_SCALE 0.7978846f  // sqrt(2/pi)
#define GELU_CUBE 0.044715f

// sig = 1 / (1 + e^-g); *one_minus = 1 - sig, taken as e * sig where that avoids the cancellation.
__device__ __forceinline__ float swiglu_sigmoid(float g, float* one_minus) {
    float e = expf(-g);
    float sig = 1.0f / (1.0f + e);
    *one_minus = e > 1.0f ? 1.0f - sig : e * sig;
    return sig;
}

// SwiGLU of one element: silu(g) * u, silu(g) = g * sigmoid(g).
__device__ __forceinline__ float swiglu_one(float g, float u) {
    float om;
    float sig = swiglu_sigmoid(g, &om);
    return (g * sig) * u;
}

// Its backward: d(gate) = dy * u * silu'(g), d(up) = dy * silu(g), silu'(g) = sig + g sig (1 - sig).
__device__ __forceinline__ void dswiglu_one(float g, float u, float dy, float& dg, float& du) {
    float om;
    float sig = swiglu_sigmoid(g, &om);
    float dsilu = sig + g * sig * om;
    dg = (dy * u) * dsilu;
    du = dy * (g * sig);
}

// GELU, tanh approximation (GPT-2), through 0.5 (1 + tanh(a)) = sigmoid(2a): one expf.
__device__ __forceinline__ float gelu_one(float x) {
    float a = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    return x / (1.0f + expf(-2.0f * a));
}

// Its backward: (sig + 2 x sig (1 - sig) da/dx) * dy, sig = sigmoid(2a).
__device__ __forceinline__ float dgelu_one(float x, float dy) {
    float x2 = x * x;
    float a = GELU_SCALE * (x + GELU_CUBE * x2 * x);
    float e = expf(-2.0f * a);
    float sig = 1.0f / (1.0f + e);
    float one_minus = e > 1.0f ? 1.0f - sig : e * sig;
    float da_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x2);
    return (sig + 2.0f * x * (sig * one_minus) * da_dx) * dy;
}

// Whether p (f32, or BF16 with bf16) is aligned for a 4-wide load (16 or 8 bytes).
__device__ __forceinline__ bool aligned4(const void* p, int bf16) {
    return ((u64)p & (bf16 ? 7 : 15)) == 0;
}

// The 4 BF16 values packed two to a word in w (the lower half first), as f32.
__device__ __forceinline__ void unpack_bf16x4(uint2 w, float (&v)[4]) {
    v[0] = __uint_as_float(w.x << 16);
    v[1] = __uint_as_float(w.x & 0xffff0000u);
    v[2] = __uint_as_float(w.y << 16);
    v[3] = __uint_as_float(w.y & 0xffff0000u);
}

// Values i..i+3 of p (f32, or BF16 with bf16) into v. With `vec` (p aligned4 and i a multiple of
// 4) one 16-byte (f32) or 8-byte (BF16) load reads them; else the first `valid` one by one, the
// rest 0.
__device__ __forceinline__ void load4(const void* __restrict__ p, u64 i, int bf16, bool vec, int valid, float (&v)[4]) {
    if (vec && bf16) {
        unpack_bf16x4(__ldg((const uint2*)((const unsigned short*)p + i)), v);
    } else if (vec) {
        float4 w = __ldg((const float4*)((const float*)p + i));
        v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
    } else {
        for (int k = 0; k < 4; k++) v[k] = k < valid ? load_value(p, i + k, bf16) : 0.0f;
    }
}
