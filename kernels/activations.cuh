// The element math of the activation functions between fc1 and fc2 (SwiGLU for Llama, GELU for
// GPT), forward and backward (their 4-wide loader, load4, is common.cuh's). One definition for the kernels
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
