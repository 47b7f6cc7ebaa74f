// AdamW with FP32 master weights, decoupled weight decay, the CPU reference's exact sequence:
// g *= grad_scale; p *= decay (= 1 - lr*wd); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)), with step_size = lr / (1 - b1^t) and
// bc2_sqrt = sqrt(1 - b2^t) computed on the host in f64. g holds f32 values, or BF16 values with
// g_bf16 (a weight gradient, assigned by its wgrad GEMM and so BF16 already, may be stored so).
#include "common.cuh"

extern "C" __global__ void adamw_fwd(float* __restrict__ p, const void* __restrict__ g, int g_bf16, float* __restrict__ m,
                                     float* __restrict__ v, u64 n, float beta1, float beta2, float eps,
                                     float decay, float step_size, float bc2_sqrt, float grad_scale) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float gi = load_value(g, i, g_bf16);
        if (grad_scale != 1.0f) gi *= grad_scale;
        float pi = p[i] * decay;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step_size * (mi / denom);
    }
}
