// Fused ("flash") attention, forward and backward, causal or not, with grouped-query heads, on BF16
// tensor cores (WMMA 16x16x16, f32 accumulation). No (T x T) matrix is ever written to memory.
//
// Layouts (as attention.cu): qkv rows are [q (NH*D) | k (KVH*D) | v (KVH*D)], f32 holding BF16
// values; query head h reads kv head h / (NH/KVH). out and dout are (B, T, NH*D).
// Numerics: q, k, v, dout are rounded to BF16 as a tile is loaded (the operands of the unfused
// path's cuBLAS GEMMs are the same BF16 values); scores, the softmax, its running max and sum, and
// every accumulator are f32; the probabilities P (unnormalised, in [0, 1]) and the score gradients
// dS are rounded to BF16 before their products, as the unfused path rounds att and dpreatt.
// Outputs (out, dqkv) are rounded to BF16. The saved statistic is the base-2 log-sum-exp of the
// scaled scores, lse2 = m + log2(l) (B, NH, T): P = exp2(s * scale * log2(e) - lse2).
//
// Tiles: 64 query rows x 64 keys per step, 4 warps of 16 rows each; D (the head size) is a
// template parameter (16, 32, 64, 96, 128). Blocks: forward and dQ one per (query tile, head,
// batch), dK/dV one per (key tile, kv head, batch) looping over the group's query heads. Every
// accumulation runs in a fixed order (no atomics): reruns are bit-identical.
// Shared memory (dynamic, above 48 KiB for D >= 64): see flash_smem_* below, mirrored in
// capture/src/backend/cuda/attention.rs.
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

#define FA_TILE 64
#define FA_WARPS 4
#define FA_THREADS (FA_WARPS * 32)
#define FA_LS (FA_TILE + 4)  // f32 score rows (a multiple of 4 floats, as WMMA stores need)
#define FA_LP (FA_TILE + 8)  // BF16 probability rows (a multiple of 8 halves)

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragBRow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBCol;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

template <int D> struct Fa {
    static constexpr int LD = D + 8;                               // BF16 tile row stride
    static constexpr int LO = D + 4;                               // f32 output-tile row stride
    static constexpr int SW = 16 * (FA_LS > LO ? FA_LS : LO);      // f32 scratch per warp
    static constexpr int TILE = FA_TILE * LD;                      // halves per tile
};

// Loads rows row0 .. row0+63 of a (T, w) f32 matrix (batch base `src`), columns col .. col+D-1,
// into a BF16 tile; rows past T are zero. All threads of the block take part.
template <int D>
__device__ __forceinline__ void fa_load(bf16* dst, const float* src, int w, int col, int row0, int t) {
    constexpr int V = D / 4;
    for (int e = threadIdx.x; e < FA_TILE * V; e += FA_THREADS) {
        int r = e / V, c = (e % V) * 4;
        int tt = row0 + r;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (tt < t) x = *reinterpret_cast<const float4*>(src + (u64)tt * w + col + c);
        bf16* o = dst + r * Fa<D>::LD + c;
        o[0] = __float2bfloat16_rn(x.x);
        o[1] = __float2bfloat16_rn(x.y);
        o[2] = __float2bfloat16_rn(x.z);
        o[3] = __float2bfloat16_rn(x.w);
    }
}

// acc[j] (16 x 16, j < 4) = a (16 x D rows of `a`) times the transpose of rows 16j .. 16j+15 of `b`
// (a 64 x D tile), stored into the warp's f32 scratch (16 x 64, row stride FA_LS).
template <int D>
__device__ __forceinline__ void fa_abt(float* sw, const bf16* a, const bf16* b) {
    for (int j = 0; j < FA_TILE / 16; j++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            FragA fa;
            FragBCol fb;
            wmma::load_matrix_sync(fa, a + kk * 16, Fa<D>::LD);
            wmma::load_matrix_sync(fb, b + j * 16 * Fa<D>::LD + kk * 16, Fa<D>::LD);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(sw + j * 16, acc, FA_LS, wmma::mem_row_major);
    }
}

// acc[j] (+)= p (16 x 64 BF16, row stride FA_LP) times columns 16j .. of the 64 x D tile `b`.
template <int D>
__device__ __forceinline__ void fa_pb(FragC* acc, const bf16* p, const bf16* b) {
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
#pragma unroll
        for (int kk = 0; kk < FA_TILE / 16; kk++) {
            FragA fa;
            FragBRow fb;
            wmma::load_matrix_sync(fa, p + kk * 16, FA_LP);
            wmma::load_matrix_sync(fb, b + kk * 16 * Fa<D>::LD + j * 16, Fa<D>::LD);
            wmma::mma_sync(acc[j], fa, fb, acc[j]);
        }
    }
}

// Whether key kj may be attended by query qi.
__device__ __forceinline__ bool fa_visible(int qi, int kj, int t, int causal) {
    return qi < t && kj < t && (!causal || kj <= qi);
}

// Writes a warp's 16 x D accumulator rows (times `scale`, rounded to BF16) to rows row0 .. of a
// (T, w) f32 matrix at column col, through the warp's scratch.
template <int D>
__device__ __forceinline__ void fa_store_rows(float* dst, int w, int col, int row0, int t, FragC* acc, float* sw, float scale) {
    constexpr int LO = Fa<D>::LO;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < D / 16; j++) wmma::store_matrix_sync(sw + j * 16, acc[j], LO, wmma::mem_row_major);
    __syncwarp();
    int lane = threadIdx.x & 31;
    for (int e = lane; e < 16 * D; e += 32) {
        int r = e / D, c = e % D;
        int tt = row0 + r;
        if (tt < t) dst[(u64)tt * w + col + c] = round_bf16(sw[r * LO + c] * scale);
    }
}

// Forward. Grid (ceil(T/64), NH, B), FA_THREADS threads. Lane l of warp w owns query row
// r = l & 15 of the warp's 16 and the columns of parity l >> 4 of each 64-key tile and of D.
template <int D>
__device__ void flash_fwd(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ qkv, int t, int nh,
                          int kvh, float scale, int causal) {
    extern __shared__ __align__(128) unsigned char fa_smem[];
    constexpr int LD = Fa<D>::LD, LO = Fa<D>::LO, SW = Fa<D>::SW;
    bf16* qs = reinterpret_cast<bf16*>(fa_smem);
    bf16* ks = qs + Fa<D>::TILE;
    bf16* vs = ks + Fa<D>::TILE;
    float* scratch = reinterpret_cast<float*>(vs + Fa<D>::TILE);
    bf16* probs = reinterpret_cast<bf16*>(scratch + FA_WARPS * SW);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int g = h / (nh / kvh);
    int c = nh * D, w = c + 2 * kvh * D;
    const float* base = qkv + (u64)b * t * w;
    int q0 = qb * FA_TILE;
    float* sw = scratch + warp * SW;
    bf16* pw = probs + warp * 16 * FA_LP;
    fa_load<D>(qs, base, w, h * D, q0, t);
    __syncthreads();
    FragA qf[D / 16];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wmma::load_matrix_sync(qf[kk], qs + warp * 16 * LD + kk * 16, LD);
    int r = lane & 15, par = lane >> 4;
    int qi = q0 + warp * 16 + r;
    const float sl2 = scale * 1.4426950408889634f;
    float m = -INFINITY, l = 0.0f;
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
    int ntiles = (t + FA_TILE - 1) / FA_TILE;
    int nkb = causal ? min(qb + 1, ntiles) : ntiles;
    for (int kb = 0; kb < nkb; kb++) {
        __syncthreads();
        fa_load<D>(ks, base, w, c + g * D, kb * FA_TILE, t);
        fa_load<D>(vs, base, w, c + kvh * D + g * D, kb * FA_TILE, t);
        __syncthreads();
        // S = Q K^T, 16 x 64 per warp.
        for (int j = 0; j < FA_TILE / 16; j++) {
            FragC acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                FragBCol fb;
                wmma::load_matrix_sync(fb, ks + j * 16 * LD + kk * 16, LD);
                wmma::mma_sync(acc, qf[kk], fb, acc);
            }
            wmma::store_matrix_sync(sw + j * 16, acc, FA_LS, wmma::mem_row_major);
        }
        __syncwarp();
        float sv[FA_TILE / 2];
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < FA_TILE / 2; i++) {
            int kc = 2 * i + par;
            bool ok = fa_visible(qi, kb * FA_TILE + kc, t, causal);
            sv[i] = ok ? sw[r * FA_LS + kc] * sl2 : -INFINITY;
            mx = fmaxf(mx, sv[i]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        float mnew = fmaxf(m, mx);
        float mref = mnew == -INFINITY ? 0.0f : mnew;
        float alpha = exp2f(m - mref);
        float ls = 0.0f;
#pragma unroll
        for (int i = 0; i < FA_TILE / 2; i++) {
            float p = exp2f(sv[i] - mref);
            ls += p;
            pw[r * FA_LP + 2 * i + par] = __float2bfloat16_rn(p);
        }
        ls += __shfl_xor_sync(0xffffffffu, ls, 16);
        l = l * alpha + ls;
        m = mnew;
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] *= alpha;
        __syncwarp();
        // O_tile = P V, 16 x D per warp, through the scratch.
#pragma unroll
        for (int j = 0; j < D / 16; j++) {
            FragC acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < FA_TILE / 16; kk++) {
                FragA fa;
                FragBRow fb;
                wmma::load_matrix_sync(fa, pw + kk * 16, FA_LP);
                wmma::load_matrix_sync(fb, vs + kk * 16 * LD + j * 16, LD);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(sw + j * 16, acc, LO, wmma::mem_row_major);
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] += sw[r * LO + 2 * i + par];
        __syncwarp();
    }
    if (qi < t) {
        float inv = 1.0f / l;
        float* orow = out + ((u64)b * t + qi) * c + h * D;
#pragma unroll
        for (int i = 0; i < D / 2; i++) orow[2 * i + par] = round_bf16(o[i] * inv);
        if (par == 0) lse[((u64)b * nh + h) * t + qi] = m + log2f(l);
    }
}

// delta (B, NH, T) = rowsum(BF16(dout) * out) per head: the softmax backward's correction term.
// Launch: one warp per (b, t, h) row, 8 warps per block.
extern "C" __global__ void flash_bwd_delta(float* __restrict__ delta, const float* __restrict__ dout,
                                           const float* __restrict__ out, int b, int t, int nh, int d) {
    u64 row = blockIdx.x * 8ull + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= (u64)b * t * nh) return;
    int h = (int)(row % nh);
    u64 bt = row / nh;
    const float* g = dout + bt * nh * d + (u64)h * d;
    const float* y = out + bt * nh * d + (u64)h * d;
    float s = 0.0f;
    for (int i = lane; i < d; i += 32) s += __bfloat162float(__float2bfloat16_rn(g[i])) * y[i];
    s = warp_sum(s);
    if (lane == 0) {
        int tt = (int)(bt % t);
        u64 bb = bt / t;
        delta[(bb * nh + h) * t + tt] = s;
    }
}

// Loads the per-row lse2 and delta of query rows q0 .. q0+63 of head h (0 past T).
__device__ __forceinline__ void fa_load_rows(float* lse_s, float* dd_s, const float* lse, const float* delta, u64 head_row0, int q0, int t) {
    for (int i = threadIdx.x; i < FA_TILE; i += FA_THREADS) {
        bool in = q0 + i < t;
        lse_s[i] = in ? lse[head_row0 + q0 + i] : 0.0f;
        dd_s[i] = in ? delta[head_row0 + q0 + i] : 0.0f;
    }
}

// dK and dV. Grid (ceil(T/64), KVH, B), FA_THREADS threads; warp w owns keys 16w .. 16w+15 of the
// block's tile; its lanes own (key row l & 15, query columns of parity l >> 4).
// dV = sum over the group's heads and queries of P^T dO; dK = scale * sum dS^T Q.
template <int D>
__device__ void flash_bwd_dkdv(float* __restrict__ dqkv, const float* __restrict__ qkv, const float* __restrict__ dout,
                               const float* __restrict__ lse, const float* __restrict__ delta, int t, int nh, int kvh,
                               float scale, int causal) {
    extern __shared__ __align__(128) unsigned char fa_smem[];
    constexpr int LD = Fa<D>::LD, SW = Fa<D>::SW;
    bf16* ks = reinterpret_cast<bf16*>(fa_smem);
    bf16* vs = ks + Fa<D>::TILE;
    bf16* qs = vs + Fa<D>::TILE;
    bf16* dos = qs + Fa<D>::TILE;
    float* lse_s = reinterpret_cast<float*>(dos + Fa<D>::TILE);
    float* dd_s = lse_s + FA_TILE;
    float* scratch = dd_s + FA_TILE;
    bf16* pbuf = reinterpret_cast<bf16*>(scratch + FA_WARPS * SW);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kb = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    int rep = nh / kvh;
    int c = nh * D, w = c + 2 * kvh * D;
    const float* base = qkv + (u64)b * t * w;
    const float* gbase = dout + (u64)b * t * c;
    int k0 = kb * FA_TILE;
    float* sw = scratch + warp * SW;
    bf16* pw = pbuf + warp * 2 * 16 * FA_LP;
    bf16* dsw = pw + 16 * FA_LP;
    fa_load<D>(ks, base, w, c + g * D, k0, t);
    fa_load<D>(vs, base, w, c + kvh * D + g * D, k0, t);
    FragC dk[D / 16], dv[D / 16];
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        wmma::fill_fragment(dk[j], 0.0f);
        wmma::fill_fragment(dv[j], 0.0f);
    }
    int r = lane & 15, par = lane >> 4;
    int kj = k0 + warp * 16 + r;
    const float sl2 = scale * 1.4426950408889634f;
    int ntiles = (t + FA_TILE - 1) / FA_TILE;
    for (int hh = 0; hh < rep; hh++) {
        int h = g * rep + hh;
        u64 head_row0 = ((u64)b * nh + h) * t;
        for (int qb = causal ? kb : 0; qb < ntiles; qb++) {
            int q0 = qb * FA_TILE;
            __syncthreads();
            fa_load<D>(qs, base, w, h * D, q0, t);
            fa_load<D>(dos, gbase, c, h * D, q0, t);
            fa_load_rows(lse_s, dd_s, lse, delta, head_row0, q0, t);
            __syncthreads();
            // S^T = K_w Q^T (16 keys x 64 queries) -> P^T.
            fa_abt<D>(sw, ks + warp * 16 * LD, qs);
            __syncwarp();
            float p[FA_TILE / 2];
#pragma unroll
            for (int i = 0; i < FA_TILE / 2; i++) {
                int qc = 2 * i + par;
                bool ok = fa_visible(q0 + qc, kj, t, causal);
                p[i] = ok ? exp2f(sw[r * FA_LS + qc] * sl2 - lse_s[qc]) : 0.0f;
                pw[r * FA_LP + qc] = __float2bfloat16_rn(p[i]);
            }
            __syncwarp();
            // dP^T = V_w dO^T -> dS^T = P^T (dP^T - delta).
            fa_abt<D>(sw, vs + warp * 16 * LD, dos);
            __syncwarp();
#pragma unroll
            for (int i = 0; i < FA_TILE / 2; i++) {
                int qc = 2 * i + par;
                dsw[r * FA_LP + qc] = __float2bfloat16_rn(p[i] * (sw[r * FA_LS + qc] - dd_s[qc]));
            }
            __syncwarp();
            fa_pb<D>(dv, pw, dos);
            fa_pb<D>(dk, dsw, qs);
        }
    }
    int krow0 = k0 + warp * 16;
    fa_store_rows<D>(dqkv + (u64)b * t * w, w, c + g * D, krow0, t, dk, sw, scale);
    fa_store_rows<D>(dqkv + (u64)b * t * w, w, c + kvh * D + g * D, krow0, t, dv, sw, 1.0f);
}

// dQ. Grid (ceil(T/64), NH, B), FA_THREADS threads; warp w owns query rows 16w .. 16w+15 of the
// tile; its lanes own (query row l & 15, key columns of parity l >> 4). dQ = scale * sum dS K.
template <int D>
__device__ void flash_bwd_dq(float* __restrict__ dqkv, const float* __restrict__ qkv, const float* __restrict__ dout,
                             const float* __restrict__ lse, const float* __restrict__ delta, int t, int nh, int kvh,
                             float scale, int causal) {
    extern __shared__ __align__(128) unsigned char fa_smem[];
    constexpr int LD = Fa<D>::LD, SW = Fa<D>::SW;
    bf16* qs = reinterpret_cast<bf16*>(fa_smem);
    bf16* dos = qs + Fa<D>::TILE;
    bf16* ks = dos + Fa<D>::TILE;
    bf16* vs = ks + Fa<D>::TILE;
    float* lse_s = reinterpret_cast<float*>(vs + Fa<D>::TILE);
    float* dd_s = lse_s + FA_TILE;
    float* scratch = dd_s + FA_TILE;
    bf16* pbuf = reinterpret_cast<bf16*>(scratch + FA_WARPS * SW);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int g = h / (nh / kvh);
    int c = nh * D, w = c + 2 * kvh * D;
    const float* base = qkv + (u64)b * t * w;
    int q0 = qb * FA_TILE;
    float* sw = scratch + warp * SW;
    bf16* dsw = pbuf + warp * 2 * 16 * FA_LP;
    fa_load<D>(qs, base, w, h * D, q0, t);
    fa_load<D>(dos, dout + (u64)b * t * c, c, h * D, q0, t);
    fa_load_rows(lse_s, dd_s, lse, delta, ((u64)b * nh + h) * t, q0, t);
    FragC dq[D / 16];
#pragma unroll
    for (int j = 0; j < D / 16; j++) wmma::fill_fragment(dq[j], 0.0f);
    int r = lane & 15, par = lane >> 4;
    int row = warp * 16 + r;
    int qi = q0 + row;
    const float sl2 = scale * 1.4426950408889634f;
    int ntiles = (t + FA_TILE - 1) / FA_TILE;
    int nkb = causal ? min(qb + 1, ntiles) : ntiles;
    for (int kb = 0; kb < nkb; kb++) {
        int k0 = kb * FA_TILE;
        __syncthreads();
        fa_load<D>(ks, base, w, c + g * D, k0, t);
        fa_load<D>(vs, base, w, c + kvh * D + g * D, k0, t);
        __syncthreads();
        // S = Q_w K^T (16 x 64) -> P.
        fa_abt<D>(sw, qs + warp * 16 * LD, ks);
        __syncwarp();
        float p[FA_TILE / 2];
#pragma unroll
        for (int i = 0; i < FA_TILE / 2; i++) {
            int kc = 2 * i + par;
            bool ok = fa_visible(qi, k0 + kc, t, causal);
            p[i] = ok ? exp2f(sw[r * FA_LS + kc] * sl2 - lse_s[row]) : 0.0f;
        }
        __syncwarp();
        // dP = dO_w V^T -> dS = P (dP - delta).
        fa_abt<D>(sw, dos + warp * 16 * LD, vs);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < FA_TILE / 2; i++) {
            int kc = 2 * i + par;
            dsw[r * FA_LP + kc] = __float2bfloat16_rn(p[i] * (sw[r * FA_LS + kc] - dd_s[row]));
        }
        __syncwarp();
        fa_pb<D>(dq, dsw, ks);
    }
    fa_store_rows<D>(dqkv + (u64)b * t * w, w, h * D, q0 + warp * 16, t, dq, sw, scale);
}

#define FA_ENTRY(D)                                                                                                    \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_fwd_d##D(float* out, float* lse, const float* qkv,  \
                                                                            int t, int nh, int kvh, float scale,       \
                                                                            int causal) {                              \
        flash_fwd<D>(out, lse, qkv, t, nh, kvh, scale, causal);                                                        \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                                           \
        flash_bwd_dkdv_d##D(float* dqkv, const float* qkv, const float* dout, const float* lse, const float* delta,    \
                            int t, int nh, int kvh, float scale, int causal) {                                         \
        flash_bwd_dkdv<D>(dqkv, qkv, dout, lse, delta, t, nh, kvh, scale, causal);                                     \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                                           \
        flash_bwd_dq_d##D(float* dqkv, const float* qkv, const float* dout, const float* lse, const float* delta,      \
                          int t, int nh, int kvh, float scale, int causal) {                                           \
        flash_bwd_dq<D>(dqkv, qkv, dout, lse, delta, t, nh, kvh, scale, causal);                                       \
    }

FA_ENTRY(16)
FA_ENTRY(32)
FA_ENTRY(64)
FA_ENTRY(96)
FA_ENTRY(128)
