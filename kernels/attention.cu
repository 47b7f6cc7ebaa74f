// Multi-head attention around cuBLAS's BF16 batched GEMMs (launched from Rust).
// Forward: qkv (B,T,3C) -> q,k,v (B,NH,T,HS) BF16 -> preatt = scale * q k^T (f32, GEMM)
//   -> att = softmax (f32, saved; a BF16 copy feeds the next GEMM) -> y = att v (f32, GEMM)
//   -> out (B,T,C) rounded to BF16.
// Backward: dout (B,T,C) -> dy (B,NH,T,HS) BF16; datt = dy v^T and dv = att^T dy (GEMMs);
//   dpreatt = att * (datt - rowsum(att * datt)) (BF16); dq = scale * dpreatt k, dk = scale *
//   dpreatt^T q (GEMMs); dq, dk, dv -> dqkv (B,T,3C) (=), rounded to BF16.
#include "common.cuh"

// q, k, v (B,NH,T,HS) BF16 from qkv (B,T,3C). Launch: grid-stride over B*NH*T*HS.
extern "C" __global__ void attention_split_fwd(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                                               __nv_bfloat16* __restrict__ v, const float* __restrict__ qkv,
                                               int b, int t, int nh, int hs) {
    u64 total = (u64)b * nh * t * hs;
    int c = nh * hs;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        u64 r = i / hs;
        int tt = (int)(r % t); r /= t;
        int h = (int)(r % nh);
        int bb = (int)(r / nh);
        u64 src = ((u64)bb * t + tt) * 3 * c + (u64)h * hs + d;
        q[i] = __float2bfloat16_rn(qkv[src]);
        k[i] = __float2bfloat16_rn(qkv[src + c]);
        v[i] = __float2bfloat16_rn(qkv[src + 2 * c]);
    }
}

// Row softmax of preatt (rows of length t, (B*NH*T) rows) with the causal mask when causal != 0.
// att (f32) and att16 (BF16) receive the probabilities. Launch: one warp per row.
extern "C" __global__ void attention_softmax_fwd(float* att, __nv_bfloat16* __restrict__ att16,
                                                 const float* preatt, u64 rows, int t, int causal) {
    u64 row = blockIdx.x * (u64)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    int qi = (int)(row % t);
    int valid = causal ? qi + 1 : t;
    const float* p = preatt + row * t;
    float m = -INFINITY;
    for (int j = lane; j < valid; j += 32) m = fmaxf(m, p[j]);
    m = warp_max(m);
    float s = 0.0f;
    for (int j = lane; j < valid; j += 32) s += expf(p[j] - m);
    s = warp_sum(s);
    float inv = 1.0f / s;
    float* a = att + row * t;
    __nv_bfloat16* a16 = att16 + row * t;
    for (int j = lane; j < t; j += 32) {
        float e = j < valid ? expf(p[j] - m) * inv : 0.0f;
        a[j] = e;
        a16[j] = __float2bfloat16_rn(e);
    }
}

// out (B,T,C) = y (B,NH,T,HS) re-interleaved, rounded to BF16. Launch: grid-stride over B*T*C.
extern "C" __global__ void attention_merge_fwd(float* __restrict__ out, const float* __restrict__ y,
                                               int b, int t, int nh, int hs) {
    u64 total = (u64)b * nh * t * hs;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        u64 r = i / hs;
        int tt = (int)(r % t); r /= t;
        int h = (int)(r % nh);
        int bb = (int)(r / nh);
        out[((u64)bb * t + tt) * nh * hs + (u64)h * hs + d] = round_bf16(y[i]);
    }
}

// dy (B,NH,T,HS) BF16 from dout (B,T,C); att16 = BF16(att). Launch: grid-stride over B*NH*T*HS.
extern "C" __global__ void attention_split_bwd(__nv_bfloat16* __restrict__ dy, const float* __restrict__ dout,
                                               int b, int t, int nh, int hs) {
    u64 total = (u64)b * nh * t * hs;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        u64 r = i / hs;
        int tt = (int)(r % t); r /= t;
        int h = (int)(r % nh);
        int bb = (int)(r / nh);
        dy[i] = __float2bfloat16_rn(dout[((u64)bb * t + tt) * nh * hs + (u64)h * hs + d]);
    }
}

// dpre16 = BF16(att * (datt - sum_j att*datt)) per row, and att16 = BF16(att).
// Launch: one warp per row.
extern "C" __global__ void attention_softmax_bwd(__nv_bfloat16* __restrict__ dpre16, __nv_bfloat16* __restrict__ att16,
                                                 const float* __restrict__ att, const float* __restrict__ datt,
                                                 u64 rows, int t, int causal) {
    u64 row = blockIdx.x * (u64)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    int qi = (int)(row % t);
    int valid = causal ? qi + 1 : t;
    const float* a = att + row * t;
    const float* g = datt + row * t;
    float s = 0.0f;
    for (int j = lane; j < valid; j += 32) s += a[j] * g[j];
    s = warp_sum(s);
    for (int j = lane; j < t; j += 32) {
        float v = j < valid ? a[j] * (g[j] - s) : 0.0f;
        dpre16[row * t + j] = __float2bfloat16_rn(v);
        att16[row * t + j] = __float2bfloat16_rn(a[j]);
    }
}

// dqkv (B,T,3C) (=) from dq, dk, dv (B,NH,T,HS) f32, rounded to BF16. Launch: grid-stride.
extern "C" __global__ void attention_merge_bwd(float* __restrict__ dqkv, const float* __restrict__ dq,
                                               const float* __restrict__ dk, const float* __restrict__ dv,
                                               int b, int t, int nh, int hs) {
    u64 total = (u64)b * nh * t * hs;
    int c = nh * hs;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        u64 r = i / hs;
        int tt = (int)(r % t); r /= t;
        int h = (int)(r % nh);
        int bb = (int)(r / nh);
        u64 dst = ((u64)bb * t + tt) * 3 * c + (u64)h * hs + d;
        dqkv[dst] = round_bf16(dq[i]);
        dqkv[dst + c] = round_bf16(dk[i]);
        dqkv[dst + 2 * c] = round_bf16(dv[i]);
    }
}
