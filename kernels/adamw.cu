// AdamW with FP32 master weights, decoupled weight decay, the CPU reference's exact sequence:
// g *= grad_scale; p *= decay (= 1 - lr*wd); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)), with step_size = lr / (1 - b1^t) and
// bc2_sqrt = sqrt(1 - b2^t) computed on the host in f64. g holds f32 values, or BF16 values with
// g_bf16 (a weight gradient, assigned by its wgrad GEMM and so BF16 already, may be stored so).
// The roundings are explicit (adamw_one): the ones the compiler chose for the plain expressions of
// the one-value-a-thread kernel this replaces (p * decay fused into the last step's FMA), so that
// the 4-wide form gives those bits. Each thread updates 4 values at once (16-byte loads and stores
// of p, m and v): the optimizer is a pure stream over 26-28 bytes a parameter, and one value a
// thread kept too few bytes in flight (8.8 ms a llama-1b step, 3.3 TB/s). adamw_multi updates every
// parameter of the model in one launch: one launch a tensor left the GPU idle between small tensors'
// kernels and at each large one's tail (148 launches a step at seed batch 32).
#include "common.cuh"

// One parameter's update: p, m, v in place, from its gradient gi (already scaled).
__device__ __forceinline__ void adamw_one(float& p, float gi, float& m, float& v, float beta1, float beta2, float eps,
                                          float decay, float step_size, float bc2_sqrt) {
    m = __fmaf_rn(m, beta1, __fmul_rn(1.0f - beta1, gi));
    v = __fmaf_rn(v, beta2, __fmul_rn(gi, __fmul_rn(1.0f - beta2, gi)));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2_sqrt), eps);
    p = __fmaf_rn(p, decay, -__fmul_rn(__fdiv_rn(m, denom), step_size));
}

// One tensor's update by the threads t = 0, 1, ... (this one is t) of a grid `stride` threads wide.
__device__ __forceinline__ void adamw_tensor(float* __restrict__ p, const void* __restrict__ g, int g_bf16, float* __restrict__ m,
                                             float* __restrict__ v, u64 n, u64 t, u64 stride, float beta1, float beta2,
                                             float eps, float decay, float step_size, float bc2_sqrt, float grad_scale) {
    bool vec = aligned4(p, 0) && aligned4(m, 0) && aligned4(v, 0) && aligned4(g, g_bf16);
    u64 n4 = vec ? n / 4 : 0;
    for (u64 i = t; i < n4; i += stride) {
        float4 pw = reinterpret_cast<const float4*>(p)[i], mw = reinterpret_cast<const float4*>(m)[i],
               vw = reinterpret_cast<const float4*>(v)[i];
        float gv[4];
        load4(g, 4 * i, g_bf16, true, 4, gv);
        float pa[4] = {pw.x, pw.y, pw.z, pw.w}, ma[4] = {mw.x, mw.y, mw.z, mw.w}, va[4] = {vw.x, vw.y, vw.z, vw.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float gi = grad_scale != 1.0f ? __fmul_rn(gv[k], grad_scale) : gv[k];
            adamw_one(pa[k], gi, ma[k], va[k], beta1, beta2, eps, decay, step_size, bc2_sqrt);
        }
        reinterpret_cast<float4*>(m)[i] = make_float4(ma[0], ma[1], ma[2], ma[3]);
        reinterpret_cast<float4*>(v)[i] = make_float4(va[0], va[1], va[2], va[3]);
        reinterpret_cast<float4*>(p)[i] = make_float4(pa[0], pa[1], pa[2], pa[3]);
    }
    // The values past the last group of 4 (all of them when a buffer is not 16-byte aligned).
    for (u64 i = 4 * n4 + t; i < n; i += stride) {
        float gi = load_value(g, i, g_bf16);
        if (grad_scale != 1.0f) gi = __fmul_rn(gi, grad_scale);
        adamw_one(p[i], gi, m[i], v[i], beta1, beta2, eps, decay, step_size, bc2_sqrt);
    }
}

// One tensor, the whole grid on it.
extern "C" __global__ void adamw_fwd(float* __restrict__ p, const void* __restrict__ g, int g_bf16, float* __restrict__ m,
                                     float* __restrict__ v, u64 n, float beta1, float beta2, float eps,
                                     float decay, float step_size, float bc2_sqrt, float grad_scale) {
    adamw_tensor(p, g, g_bf16, m, v, n, blockIdx.x * (u64)blockDim.x + threadIdx.x, (u64)gridDim.x * blockDim.x, beta1, beta2,
                 eps, decay, step_size, bc2_sqrt, grad_scale);
}

// Every tensor of a multi-tensor table (common.cuh: mt_entry; pointers p, g, m, v) in one launch:
// each entry's blocks update it as adamw_fwd's grid would. Every value gets the same operations
// as in adamw_fwd, so the bits do not depend on the launch.
extern "C" __global__ void adamw_multi(const u64* __restrict__ table, int count, float beta1, float beta2, float eps,
                                       float decay, float step_size, float bc2_sqrt, float grad_scale) {
    const u64* e = mt_entry(table, count, blockIdx.x);
    u64 first = __ldg(e + MT_START), blocks = __ldg(e + MT_BLOCKS), n = __ldg(e + MT_N), flags = __ldg(e + MT_FLAGS);
    float* p = reinterpret_cast<float*>(__ldg(e + MT_PTR));
    const void* g = reinterpret_cast<const void*>(__ldg(e + MT_PTR + 1));
    float* m = reinterpret_cast<float*>(__ldg(e + MT_PTR + 2));
    float* v = reinterpret_cast<float*>(__ldg(e + MT_PTR + 3));
    adamw_tensor(p, g, (int)(flags & 1), m, v, n, (blockIdx.x - first) * blockDim.x + threadIdx.x, blocks * blockDim.x, beta1,
                 beta2, eps, decay, step_size, bc2_sqrt, grad_scale);
}
