// GELU, tanh approximation (GPT-2): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Backward: dinp (=) = gelu'(inp) * dout.
#include "common.cuh"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)

extern "C" __global__ void gelu_fwd(float* __restrict__ out, const float* __restrict__ inp, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
    }
}

extern "C" __global__ void gelu_bwd(float* __restrict__ dinp, const float* __restrict__ inp,
                                    const float* __restrict__ dout, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float arg = GELU_SCALE * (x + cube);
        float th = tanhf(arg);
        float ch = coshf(arg);
        float sech2 = 1.0f / (ch * ch);
        float local = 0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}
