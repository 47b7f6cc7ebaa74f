// What is left to do to a linear layer's GEMM output after cuBLASLt (launched by
// capture/src/backend/cuda/gemm_output.rs, the CPU reference: capture/src/layers/linear.rs): the
// bias rounded to BF16 for cuBLASLt's bias epilogue (bias_to_bf16), the pass over an f32 or
// accumulated output that cuBLASLt leaves (gemm_epilogue), the count of non-finite outputs the
// step reports (gemm_nonfinite_count, which reads the output only when an operand's cast or the
// bias met a risky value), and the clearing of the casts' RISKY flags before their slots are
// reused (slot_flags_clear). The scale-slot layout is common.cuh's.
#include "common.cuh"

// One element of gemm_epilogue: d's value v at flat index i (column col), biased, rounded, planted
// with a NaN at 0 if asked; bad counts a non-finite result.
__device__ __forceinline__ float epilogue_one(u64 i, float v, int col, const float* __restrict__ bias, int nan_first, u32& bad) {
    if (bias != nullptr) v += round_bf16(bias[col]);
    v = round_bf16(v);
    if (nan_first && i == 0) v = NAN;
    bad += !isfinite(v);
    return v;
}

// The GEMM's f32 result d (n_rows, n_cols) -> out: round_bf16(d + round_bf16(bias[col])), assigned or,
// with accumulate, added to out. d may alias out. With nan_first, out[0] = NaN (a planted NaN).
// Non-finite results are counted into *nonfinite (integer atomics: order-independent).
// With d_bf16, d holds BF16 values (cuBLASLt's BF16 output) instead of f32. With out_bf16, out
// holds BF16 values (the backend's 16-bit buffers; never with accumulate): the rounded result's top
// half; when d is out itself, only a planted NaN is written. When n_cols is a multiple of 4, each
// thread takes 4 consecutive elements of a row per step (8- or 16-byte loads).
extern "C" __global__ void gemm_epilogue(void* out, const void* d, int d_bf16, u64 n_rows, int n_cols,
                                         const float* __restrict__ bias, int accumulate, int nan_first,
                                         u64* __restrict__ nonfinite, int out_bf16) {
    u64 n = n_rows * (u64)n_cols;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u32 bad = 0;
    bool in_place = out_bf16 && d_bf16 && d == (const void*)out;
    if ((n_cols & 3) == 0) {
        for (u64 i4 = blockIdx.x * (u64)blockDim.x + threadIdx.x; i4 < n / 4; i4 += stride) {
            float v[4];
            if (d_bf16) {
                uint2 h = ((const uint2*)d)[i4];
                v[0] = __uint_as_float(h.x << 16); v[1] = __uint_as_float(h.x & 0xffff0000u);
                v[2] = __uint_as_float(h.y << 16); v[3] = __uint_as_float(h.y & 0xffff0000u);
            } else {
                float4 f = ((const float4*)d)[i4];
                v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
            }
            int col = (int)((4 * i4) % (u64)n_cols);
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = epilogue_one(4 * i4 + k, v[k], col + k, bias, nan_first, bad);
            if (out_bf16) {
                if (!in_place || (nan_first && i4 == 0)) {
                    uint2 h;
                    h.x = (__float_as_uint(v[0]) >> 16) | (__float_as_uint(v[1]) & 0xffff0000u);
                    h.y = (__float_as_uint(v[2]) >> 16) | (__float_as_uint(v[3]) & 0xffff0000u);
                    ((uint2*)out)[i4] = h;
                }
                continue;
            }
            float4 r = make_float4(v[0], v[1], v[2], v[3]);
            if (accumulate) {
                float4 o = ((const float4*)out)[i4];
                r = make_float4(o.x + r.x, o.y + r.y, o.z + r.z, o.w + r.w);
            }
            ((float4*)out)[i4] = r;
        }
    } else {
        for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += stride) {
            float v = d_bf16 ? __uint_as_float(((u32)((const unsigned short*)d)[i]) << 16) : ((const float*)d)[i];
            v = epilogue_one(i, v, (int)(i % (u64)n_cols), bias, nan_first, bad);
            if (out_bf16) {
                if (!in_place || (nan_first && i == 0)) ((unsigned short*)out)[i] = (unsigned short)(__float_as_uint(v) >> 16);
            } else {
                float* o = (float*)out;
                o[i] = accumulate ? o[i] + v : v;
            }
        }
    }
    if (nonfinite != nullptr) {
        bad = __reduce_add_sync(0xffffffffu, bad);
        if ((threadIdx.x & 31) == 0 && bad) atomicAdd(nonfinite, (u64)bad);
    }
}

// Counts the non-finite values of a GEMM's BF16 output (n values) into *nonfinite, unless the GEMM
// cannot have produced one. It cannot when each operand was cast by a kernel that met only finite
// values of magnitude at most RISKY_ABS (its slot's RISKY flag clear), an FP8 operand's values as
// the GEMM dequantises them are at most fmax * slot[SLOT_INV], and the bias (bias_flag, when the
// GEMM added one) is likewise finite and at most RISKY_ABS: then every |output| is at most
// k * A * B + RISKY_ABS, below BF16's largest finite value, and the count is exactly 0 without
// reading the output. An operand with no slot (slot null: taken as it is, never cast) always
// counts. fmax_a, fmax_b: the FP8 format's largest value, 0 for a BF16 operand. Grid-stride, 8
// values a thread a step where n allows.
extern "C" __global__ void gemm_nonfinite_count(const unsigned short* __restrict__ out, u64 n, const float* __restrict__ slot_a,
                                                float fmax_a, const float* __restrict__ slot_b, float fmax_b, int k,
                                                const u32* __restrict__ bias_flag, u64* __restrict__ nonfinite) {
    bool count = slot_a == nullptr || slot_b == nullptr;
    if (!count) {
        const u32 flag_a = __ldcg((const u32*)(slot_a + SLOT_RISKY)), flag_b = __ldcg((const u32*)(slot_b + SLOT_RISKY));
        double A = fmax_a > 0.0f ? (double)fmax_a * (double)__ldcg(slot_a + SLOT_INV) : (double)RISKY_ABS * 1.01;
        double B = fmax_b > 0.0f ? (double)fmax_b * (double)__ldcg(slot_b + SLOT_INV) : (double)RISKY_ABS * 1.01;
        bool bias_risky = bias_flag != nullptr && __ldcg(bias_flag) != 0;
        // !(x <= bound) also counts when a factor is NaN.
        count = flag_a != 0 || flag_b != 0 || bias_risky || !((double)k * A * B <= 1e36);
    }
    if (!count) return;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u32 bad = 0;
    u64 first = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    bool vec = ((u64)out & 15) == 0;
    u64 n8 = vec ? n / 8 : 0;
    for (u64 i8 = first; i8 < n8; i8 += stride) {
        uint4 h = ((const uint4*)out)[i8];
        u32 w[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
        for (int j = 0; j < 4; j++) bad += ((w[j] & 0x7f80u) == 0x7f80u) + ((w[j] & 0x7f800000u) == 0x7f800000u);
    }
    for (u64 i = 8 * n8 + first; i < n; i += stride) bad += (out[i] & 0x7f80u) == 0x7f80u;
    bad = __reduce_add_sync(0xffffffffu, bad);
    if ((threadIdx.x & 31) == 0 && bad) atomicAdd(nonfinite, (u64)bad);
}

// The bias rounded to BF16 (out: n BF16 values) for cuBLASLt's bias epilogue, which then adds the
// values gemm_epilogue adds (round_bf16(bias[col])); *flag = whether any bias value is non-finite
// or past RISKY_ABS (gemm_nonfinite_count). Launch: one block.
extern "C" __global__ void bias_to_bf16(const float* __restrict__ bias, unsigned short* __restrict__ out, int n,
                                        u32* __restrict__ flag) {
    int risky = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float b = bias[i];
        out[i] = (unsigned short)(__float_as_uint(round_bf16(b)) >> 16);
        risky |= !(fabsf(b) <= RISKY_ABS);
    }
    risky = __syncthreads_or(risky);
    if (threadIdx.x == 0) *flag = (u32)risky;
}

// Clears the RISKY flag of scale slots 0 .. n-1 (before the next step reuses them).
extern "C" __global__ void slot_flags_clear(float* __restrict__ slots, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ((u32*)slots)[(u64)i * SLOT_FLOATS + SLOT_RISKY] = 0u;
}
