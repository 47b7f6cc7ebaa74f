// Attention with grouped-query heads around cuBLAS's BF16 batched GEMMs (launched from Rust), and the
// rotary embeddings (RoPE) applied to qkv before it.
// qkv rows are [q (C = NH*HS) | k (KVH*HS) | v (KVH*HS)]; query head h uses kv head h / (NH/KVH)
// (KVH = NH: multi-head attention, rows [q | k | v] each C wide).
// Forward: qkv (B,T,W) -> q (B,NH,T,HS), k, v (B,KVH,T,HS) BF16 -> preatt = scale * q k^T (f32, GEMM
//   batched over (b, kv head), the group's NH/KVH query heads stacked as rows) -> att = softmax (f32,
//   saved; a BF16 copy feeds the next GEMM) -> y = att v (f32, GEMM) -> out (B,T,C) rounded to BF16.
// Backward: dout (B,T,C) -> dy (B,NH,T,HS) BF16; datt = dy v^T and dv = att^T dy (GEMMs);
//   dpreatt = att * (datt - rowsum(att * datt)) (BF16); dq = scale * dpreatt k, dk = scale *
//   dpreatt^T q (GEMMs); dq, dk, dv -> dqkv (B,T,W) (=), rounded to BF16. The dk and dv of a kv head
//   sum over its query heads inside one GEMM whose reduction runs over the group's stacked query rows
//   (a fixed order for a fixed shape: cuBLAS is deterministic on one GPU model).
// RoPE: rope_fwd / rope_bwd rotate the (i, i + HD/2) pairs of every q and k head by the angle of the
//   token's position, with the cos/sin table the host computes (capture/src/layers/rope.rs); each
//   output is two products and one sum in f32 without FMA contraction (common.cuh: rope_pair_fwd,
//   rope_pair_bwd), the CPU reference's operations exactly. Their input holds f32 values, or BF16 values
//   with in_bf16 (llama's qkv before RoPE is a GEMM's output, BF16 by construction, and may be
//   stored so).
#include "common.cuh"

// Rows (B*T of them, w wide, row-major; f32 values, or BF16 values with src_bf16) split into BF16
// head-major matrices: columns [0, nh*hs) into a (B,NH,T,HS), then, with kvh > 0, the next kvh*hs
// into k and the kvh*hs after them into v (B,KVH,T,HS). Each thread takes V consecutive columns (8
// when hs is a multiple of 8: one 16-byte store, from one 16-byte BF16 load or two f32 ones; else
// 1) of the rows blockIdx.y, blockIdx.y + gridDim.y, ...: no 64-bit division per element. Values
// are rounded to BF16 one by one (round to nearest even), BF16 ones copied.
template <int V>
__device__ __forceinline__ void split_heads(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                                            __nv_bfloat16* __restrict__ v, const void* __restrict__ src, int src_bf16,
                                            int b, int t, int nh, int kvh, int hs) {
    int c = nh * hs, ckv = kvh * hs, w = c + 2 * ckv;
    int col = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (col >= w) return;
    int sec = col < c ? 0 : (col < c + ckv ? 1 : 2);
    int lc = col - (sec == 0 ? 0 : (sec == 1 ? c : c + ckv));
    int heads = sec == 0 ? nh : kvh;
    int h = lc / hs, d = lc % hs;
    __nv_bfloat16* dst = sec == 0 ? q : (sec == 1 ? k : v);
    for (int row = blockIdx.y; row < b * t; row += gridDim.y) {
        int bb = row / t, tt = row % t;
        u64 si = (u64)row * w + col;
        u64 di = (((u64)bb * heads + h) * t + tt) * hs + d;
        if (V == 8) {
            uint4 out;
            if (src_bf16) {
                out = __ldg(reinterpret_cast<const uint4*>((const unsigned short*)src + si));
            } else {
                const float4* f = reinterpret_cast<const float4*>((const float*)src + si);
                float4 x0 = __ldg(f), x1 = __ldg(f + 1);
                out = make_uint4(pack_bf16(x0.x, x0.y), pack_bf16(x0.z, x0.w), pack_bf16(x1.x, x1.y), pack_bf16(x1.z, x1.w));
            }
            *reinterpret_cast<uint4*>(dst + di) = out;
        } else {
            dst[di] = __float2bfloat16_rn(load_value(src, si, src_bf16));
        }
    }
}

// q (B,NH,T,HS), k, v (B,KVH,T,HS) BF16 from qkv (B,T,C + 2*KVH*HS), f32 values or, with qkv_bf16,
// BF16 values (GPT's qkv, a GEMM's output, may be stored so). Launch: grid (ceil(W / V / 128),
// min(B*T, 65535)), 128 threads, with V = 8 when HS is a multiple of 8 (else 1).
extern "C" __global__ void attention_split_fwd(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                                               __nv_bfloat16* __restrict__ v, const void* __restrict__ qkv, int qkv_bf16,
                                               int b, int t, int nh, int kvh, int hs) {
    if (hs % 8 == 0) split_heads<8>(q, k, v, qkv, qkv_bf16, b, t, nh, kvh, hs);
    else split_heads<1>(q, k, v, qkv, qkv_bf16, b, t, nh, kvh, hs);
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

// out (B,T,C) = y (B,NH,T,HS) re-interleaved, rounded to BF16; out holds f32 values, or BF16 values
// with out_bf16. Launch: grid-stride over B*T*C.
extern "C" __global__ void attention_merge_fwd(void* __restrict__ out, int out_bf16, const float* __restrict__ y,
                                               int b, int t, int nh, int hs) {
    u64 total = (u64)b * nh * t * hs;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        int d = (int)(i % hs);
        u64 r = i / hs;
        int tt = (int)(r % t); r /= t;
        int h = (int)(r % nh);
        int bb = (int)(r / nh);
        store_value(out, ((u64)bb * t + tt) * nh * hs + (u64)h * hs + d, out_bf16, round_bf16(y[i]));
    }
}

// dy (B,NH,T,HS) BF16 from dout (B,T,C), f32 values or, with dout_bf16, BF16 values (proj's dgrad
// output may be stored so). Launch: as attention_split_fwd, over C columns.
extern "C" __global__ void attention_split_bwd(__nv_bfloat16* __restrict__ dy, const void* __restrict__ dout, int dout_bf16,
                                               int b, int t, int nh, int hs) {
    if (hs % 8 == 0) split_heads<8>(dy, nullptr, nullptr, dout, dout_bf16, b, t, nh, 0, hs);
    else split_heads<1>(dy, nullptr, nullptr, dout, dout_bf16, b, t, nh, 0, hs);
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

// dqkv (B,T,C + 2*KVH*HS) (=) from dq (B,NH,T,HS), dk, dv (B,KVH,T,HS) f32, rounded to BF16; dqkv
// holds f32 values, or BF16 values with dqkv_bf16.
// Launch: grid-stride over B*(NH + KVH)*T*HS (the dq elements, then the dk/dv pairs).
extern "C" __global__ void attention_merge_bwd(void* __restrict__ dqkv, int dqkv_bf16, const float* __restrict__ dq,
                                               const float* __restrict__ dk, const float* __restrict__ dv,
                                               int b, int t, int nh, int kvh, int hs) {
    u64 nq = (u64)b * nh * t * hs;
    u64 total = nq + (u64)b * kvh * t * hs;
    int c = nh * hs;
    u64 w = (u64)c + 2 * (u64)kvh * hs;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        bool is_q = i < nq;
        u64 j = is_q ? i : i - nq;
        int heads = is_q ? nh : kvh;
        int d = (int)(j % hs);
        u64 r = j / hs;
        int tt = (int)(r % t); r /= t;
        int h = (int)(r % heads);
        int bb = (int)(r / heads);
        u64 row = ((u64)bb * t + tt) * w;
        if (is_q) {
            store_value(dqkv, row + (u64)h * hs + d, dqkv_bf16, round_bf16(dq[j]));
        } else {
            u64 dst = row + c + (u64)h * hs + d;
            store_value(dqkv, dst, dqkv_bf16, round_bf16(dk[j]));
            store_value(dqkv, dst + (u64)kvh * hs, dqkv_bf16, round_bf16(dv[j]));
        }
    }
}

// Stores v at out[i]: f32, or with out_bf16 rounded to BF16 (round to nearest even), for a reader
// that rounds it so anyway (the attention's splits): the GPU's saved rotated qkv rows when its
// attention runs unfused (capture/src/backend/cuda/attention.rs: rope_attention_fwd_impl).
__device__ __forceinline__ void rope_store(void* out, int out_bf16, u64 i, float v) {
    if (out_bf16) ((__nv_bfloat16*)out)[i] = __float2bfloat16_rn(v);
    else ((float*)out)[i] = v;
}

// RoPE over qkv rows (B,T,W): the (i, i + HD/2) pairs of the NH q and KVH k heads rotated by
// position t = row % T (rope_pair_fwd, or with BWD rope_pair_bwd: the inverse rotation, for the
// gradient), the KVH v heads copied. tab (T, HD): row t = [cos (HD/2) | sin (HD/2)]. in f32, or
// BF16 with in_bf16; out f32, or BF16 with out_bf16 (rope_store). Grid-stride over rows * HD/2
// (rows = B*T); thread (row, i) writes elements i and i + HD/2 of every head of the row.
template <bool BWD>
__device__ __forceinline__ void rope_rows(void* __restrict__ out, int out_bf16, const void* __restrict__ in, int in_bf16,
                                          const float* __restrict__ tab, u64 rows, int t, int nh, int kvh, int hd) {
    int half = hd / 2;
    u64 w = (u64)(nh + 2 * kvh) * hd;
    u64 total = rows * half;
    for (u64 idx = blockIdx.x * (u64)blockDim.x + threadIdx.x; idx < total; idx += (u64)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        u64 row = idx / half;
        const float* cs = tab + (row % t) * hd;
        float c = cs[i], s = cs[half + i];
        u64 x0 = row * w;
        for (int h = 0; h < nh + kvh; h++) {
            int p = h * hd + i;
            float x1 = load_value(in, x0 + p, in_bf16), x2 = load_value(in, x0 + p + half, in_bf16), o1, o2;
            if (BWD) rope_pair_bwd(x1, x2, c, s, o1, o2);
            else rope_pair_fwd(x1, x2, c, s, o1, o2);
            rope_store(out, out_bf16, x0 + p, o1);
            rope_store(out, out_bf16, x0 + p + half, o2);
        }
        for (int h = nh + kvh; h < nh + 2 * kvh; h++) {
            int p = h * hd + i;
            rope_store(out, out_bf16, x0 + p, load_value(in, x0 + p, in_bf16));
            rope_store(out, out_bf16, x0 + p + half, load_value(in, x0 + p + half, in_bf16));
        }
    }
}

// RoPE forward: out (=) = qkv rotated (rope_rows). Launch: grid-stride over rows * HD/2.
extern "C" __global__ void rope_fwd(void* __restrict__ out, int out_bf16, const void* __restrict__ qkv, int in_bf16,
                                    const float* __restrict__ tab, u64 rows, int t, int nh, int kvh, int hd) {
    rope_rows<false>(out, out_bf16, qkv, in_bf16, tab, rows, t, nh, kvh, hd);
}


// 4 values rounded to BF16 (round to nearest even) at dst[i..i+4]: one 8-byte store.
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, u64 i, const float (&v)[4]) {
    *reinterpret_cast<uint2*>(dst + i) = make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
}

// RoPE and the split in one pass: q (B,NH,T,HD), k, v (B,KVH,T,HD) BF16, head-major, from the qkv
// rows before the rotation (f32, or BF16 with in_bf16). Each q and k value is rope_fwd's (the same
// uncontracted f32 operations) rounded to BF16 as attention_split_fwd rounds it; v is copied
// (rounded): the values, bit for bit, of rope_fwd then attention_split_fwd. HD a multiple of 8.
// Launch: grid (ceil((NH + 2 KVH) HD/8 / 128), min(B*T, 65535)), 128 threads; a thread takes the
// pairs i .. i+3 (with i + HD/2 .. i + HD/2 + 3) of one head, in rows blockIdx.y, + gridDim.y, ...
extern "C" __global__ void rope_split_fwd(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                                          __nv_bfloat16* __restrict__ v, const void* __restrict__ qkv, int in_bf16,
                                          const float* __restrict__ tab, int b, int t, int nh, int kvh, int hd) {
    int half = hd / 2, chunks = half / 4, heads = nh + 2 * kvh;
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= heads * chunks) return;
    int h = x / chunks, i = (x % chunks) * 4;
    int sec = h < nh ? 0 : (h < nh + kvh ? 1 : 2);
    int hh = sec == 0 ? h : (sec == 1 ? h - nh : h - nh - kvh);
    int hcount = sec == 0 ? nh : kvh;
    __nv_bfloat16* dst = sec == 0 ? q : (sec == 1 ? k : v);
    u64 w = (u64)heads * hd;
    for (int row = blockIdx.y; row < b * t; row += gridDim.y) {
        int bb = row / t, tt = row % t;
        u64 src = (u64)row * w + (u64)h * hd + i;
        float x1[4], x2[4], o1[4], o2[4];
        load4(qkv, src, in_bf16, true, 4, x1);  // src and half: multiples of 4 (HD a multiple of 8)
        load4(qkv, src + half, in_bf16, true, 4, x2);
        if (sec < 2) {
            const float* cs = tab + (u64)tt * hd;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                rope_pair_fwd(x1[j], x2[j], __ldg(cs + i + j), __ldg(cs + half + i + j), o1[j], o2[j]);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                o1[j] = x1[j];
                o2[j] = x2[j];
            }
        }
        u64 di = (((u64)bb * hcount + hh) * t + tt) * hd + i;
        store_bf16x4(dst, di, o1);
        store_bf16x4(dst, di + half, o2);
    }
}

// RoPE backward: dqkv (B,T,W) (=, f32) from dout, the inverse (transposed) rotation on q and k:
// dx[i] = dy[i] cos + dy[i + HD/2] sin, dx[i + HD/2] = dy[i + HD/2] cos - dy[i] sin; v copied
// (rope_rows). Launch: as rope_fwd.
extern "C" __global__ void rope_bwd(float* __restrict__ dqkv, const void* __restrict__ dout, int in_bf16,
                                    const float* __restrict__ tab, u64 rows, int t, int nh, int kvh, int hd) {
    rope_rows<true>(dqkv, 0, dout, in_bf16, tab, rows, t, nh, kvh, hd);
}
