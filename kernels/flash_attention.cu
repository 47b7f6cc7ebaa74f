// Fused ("flash") attention, forward and backward, causal or not, with grouped-query heads, on BF16
// tensor cores (mma.sync m16n8k16, f32 accumulation). No (T x T) matrix is ever written to memory,
// and the scores, probabilities and their gradients never leave the registers.
//
// Layouts: q and dout (B, NH, T, D), k and v (B, KVH, T, D), BF16, split from the f32 qkv and dout
// rows by attention.cu's attention_split_fwd / attention_split_bwd (one pass each); query head h
// reads kv head h / (NH/KVH). out (B, T, NH*D) and dqkv (B, T, (NH + 2 KVH) D) are f32 rows.
// Tiles stream from global to shared memory with cp.async, double-buffered: the next tile loads
// while the current one is multiplied.
// Numerics: q, k, v, dout are the BF16 values the unfused path's cuBLAS GEMMs take; scores, the
// softmax, its running max and sum, and
// every accumulator are f32; the probabilities P (unnormalised, in [0, 1]) and the score gradients
// dS are rounded to BF16 before their products, as the unfused path rounds att and dpreatt.
// Outputs (out, dqkv) are rounded to BF16. The saved statistic is the base-2 log-sum-exp of the
// scaled scores, lse2 = m + log2(l) (B, NH, T): P = exp2(s * scale * log2(e) - lse2), one FFMA and
// one ex2.approx per probability (fa_exp2). Only the tiles a mask cuts (the causal diagonal, the
// ragged end of T) test each element (fa_tile_visible); the others skip the test.
//
// Tiles: 64 query rows x 64 keys per step, 4 warps of 16 rows each; D (the head size) is a
// template parameter (16, 32, 64, 96, 128). Blocks: forward and dQ one per (query tile, head,
// batch), dK/dV one per (key tile, kv head, batch) looping over the group's query heads. Every
// accumulation runs in a fixed order (no atomics): reruns are bit-identical.
// Fragments (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + c (g the group, c its thread);
// an accumulator holds (row g, cols 2c, 2c+1) and (row g+8, same cols) of a 16 x 8 tile; an A
// operand (16 x 16) holds rows g and g+8 at k = 2c, 2c+1 and 2c+8, 2c+9 — so an accumulator pair
// (two n-blocks) becomes an A operand in registers, as FlashAttention-2 does with P.
// Shared memory: 5 (forward: q, two k and two v) or 6 (backward: two resident, four streaming) BF16
// tiles of 64 x (D+8) (capture/src/backend/cuda/attention.rs: flash_smem mirrors it).
#include "common.cuh"

#define FA_TILE 64
#define FA_WARPS 4
#define FA_THREADS (FA_WARPS * 32)

typedef __nv_bfloat16 bf16;

template <int D> struct Fa {
    static constexpr int LD = D + 8;       // BF16 tile row stride (16-byte rows, no bank conflicts)
    static constexpr int TILE = FA_TILE * LD;
    static constexpr int KS = D / 16;      // k-steps over the head dimension
    static constexpr int NB = D / 8;       // n-blocks of 8 over the head dimension
};

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const bf16* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], const bf16* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// c (16 x 8) += a (16 x 16) b (16 x 8).
__device__ __forceinline__ void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
}

// The A operand (16 x 16) at rows row0.., cols col0.. of a row-major BF16 tile.
template <int D>
__device__ __forceinline__ void load_a(u32 (&a)[4], const bf16* tile, int row0, int col0) {
    int l = threadIdx.x & 31;
    ldsm_x4(a, tile + (row0 + (l & 15)) * Fa<D>::LD + col0 + (l >> 4) * 8);
}

// B operands of two n-blocks (n0, n0+8) at k0.. when the tile stores B transposed (rows = n,
// cols = k: k and q tiles for S = Q K^T). b[0], b[1]: n-block n0; b[2], b[3]: n0 + 8.
template <int D>
__device__ __forceinline__ void load_b_nk(u32 (&b)[4], const bf16* tile, int n0, int k0) {
    int l = threadIdx.x & 31;
    ldsm_x4(b, tile + (n0 + (l & 7) + (l >> 4) * 8) * Fa<D>::LD + k0 + ((l >> 3) & 1) * 8);
}

// B operands of two n-blocks (n0, n0+8) at k0.. when the tile stores B as is (rows = k, cols = n:
// the v tile for P V).
template <int D>
__device__ __forceinline__ void load_b_kn(u32 (&b)[4], const bf16* tile, int k0, int n0) {
    int l = threadIdx.x & 31;
    ldsm_x4_t(b, tile + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * Fa<D>::LD + n0 + (l >> 4) * 8);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    u32 a = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Starts loading rows row0 .. row0+63 of a head's (T, D) BF16 matrix into a tile; rows past T are
// zero-filled. All threads of the block take part; the caller commits and waits.
template <int D>
__device__ __forceinline__ void fa_load(bf16* dst, const bf16* src, int row0, int t) {
    constexpr int V = D / 8;
    for (int e = threadIdx.x; e < FA_TILE * V; e += FA_THREADS) {
        int r = e / V, c = (e % V) * 8;
        bf16* d = dst + r * Fa<D>::LD + c;
        if (row0 + r < t) cp_async16(d, src + (u64)(row0 + r) * D + c);
        else *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// acc (16 x 64) = a-rows (16 x D, the warp's A operands) times the transpose of a 64 x D tile.
template <int D>
__device__ __forceinline__ void fa_abt(float (&acc)[8][4], const u32 (&a)[Fa<D>::KS][4], const bf16* tile) {
#pragma unroll
    for (int nb = 0; nb < 8; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nb][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < Fa<D>::KS; kk++) {
#pragma unroll
        for (int np = 0; np < 4; np++) {
            u32 b[4];
            load_b_nk<D>(b, tile, np * 16, kk * 16);
            mma16816(acc[2 * np], a[kk], b[0], b[1]);
            mma16816(acc[2 * np + 1], a[kk], b[2], b[3]);
        }
    }
}

// acc (16 x D) += p (16 x 64, accumulator layout, rounded to BF16 here) times a 64 x D tile.
template <int D>
__device__ __forceinline__ void fa_pv(float (&acc)[Fa<D>::NB][4], const float (&p)[8][4], const bf16* tile) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 a[4] = {pack_bf16(p[2 * j][0], p[2 * j][1]), pack_bf16(p[2 * j][2], p[2 * j][3]),
                    pack_bf16(p[2 * j + 1][0], p[2 * j + 1][1]), pack_bf16(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
        for (int np = 0; np < Fa<D>::NB / 2; np++) {
            u32 b[4];
            load_b_kn<D>(b, tile, j * 16, np * 16);
            mma16816(acc[2 * np], a, b[0], b[1]);
            mma16816(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// Whether key kj may be attended by query qi.
__device__ __forceinline__ bool fa_visible(int qi, int kj, int t, int causal) {
    return qi < t && kj < t && (!causal || kj <= qi);
}

// Whether every key of the 64-key tile at k0 is visible to every query of the 64-query tile at
// q0 (fa_visible holds for the whole tile): only such tiles skip the per-element mask; the others
// (the causal diagonal, the last tiles of a T that is not a multiple of 64) apply it.
__device__ __forceinline__ bool fa_tile_visible(int q0, int k0, int t, int causal) {
    return q0 + FA_TILE <= t && k0 + FA_TILE <= t && (!causal || k0 + FA_TILE - 1 <= q0);
}

// Sets x[nb][e] to `fill` where the mask hides it. x is a warp's 16 x 64 accumulator: element
// (nb, e) lies in the warp's own row own0 + 8 (e >> 1) (g folded into own0) and the tile's column
// other0 + 8 nb + 2 cq + (e & 1). OWN_IS_QUERY: the own rows are queries and the columns keys
// (forward, dQ); otherwise the own rows are keys and the columns queries (dK/dV).
template <bool OWN_IS_QUERY>
__device__ __forceinline__ void fa_mask(float (&x)[8][4], int own0, int other0, int cq, int t, int causal, float fill) {
#pragma unroll
    for (int nb = 0; nb < 8; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int own = own0 + 8 * (e >> 1), other = other0 + nb * 8 + 2 * cq + (e & 1);
            if (!fa_visible(OWN_IS_QUERY ? own : other, OWN_IS_QUERY ? other : own, t, causal)) x[nb][e] = fill;
        }
}

// 2^x in one MUFU instruction (flushing subnormal results to zero); every probability of the
// forward and the backward goes through it, so the backward recomputes the forward's exactly.
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Writes a warp's 16 x D accumulator (rows row0 + g, row0 + g + 8), times `scale` and rounded to
// BF16, into a (T, w) f32 matrix at column col.
template <int D>
__device__ __forceinline__ void fa_store(float* dst, int w, int col, int row0, int t, const float (&acc)[Fa<D>::NB][4], float scale0, float scale1) {
    int l = threadIdx.x & 31, g = l >> 2, c = l & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int tt = row0 + g + 8 * half;
        if (tt >= t) continue;
        float s = half ? scale1 : scale0;
        float* o = dst + (u64)tt * w + col + 2 * c;
#pragma unroll
        for (int nb = 0; nb < Fa<D>::NB; nb++) {
            float2 v = make_float2(round_bf16(acc[nb][2 * half] * s), round_bf16(acc[nb][2 * half + 1] * s));
            *reinterpret_cast<float2*>(o + nb * 8) = v;
        }
    }
}

// Forward. Grid (ceil(T/64), NH, B), FA_THREADS threads; warp w owns query rows 16w .. 16w+15.
template <int D>
__device__ void flash_fwd(float* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q, const bf16* __restrict__ k,
                          const bf16* __restrict__ v, int t, int nh, int kvh, float scale, int causal) {
    extern __shared__ __align__(128) unsigned char fa_smem[];
    bf16* qs = reinterpret_cast<bf16*>(fa_smem);
    bf16* ks = qs + Fa<D>::TILE;       // two buffers
    bf16* vs = ks + 2 * Fa<D>::TILE;   // two buffers
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int grp = h / (nh / kvh);
    int c = nh * D;
    const bf16* qh = q + ((u64)b * nh + h) * t * D;
    const bf16* kh = k + ((u64)b * kvh + grp) * t * D;
    const bf16* vh = v + ((u64)b * kvh + grp) * t * D;
    int q0 = qb * FA_TILE;
    int ntiles = (t + FA_TILE - 1) / FA_TILE;
    int nkb = causal ? min(qb + 1, ntiles) : ntiles;
    fa_load<D>(qs, qh, q0, t);
    cp_async_commit();
    fa_load<D>(ks, kh, 0, t);
    fa_load<D>(vs, vh, 0, t);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    u32 qa[Fa<D>::KS][4];
#pragma unroll
    for (int kk = 0; kk < Fa<D>::KS; kk++) load_a<D>(qa[kk], qs, warp * 16, kk * 16);
    int qi0 = q0 + warp * 16 + g;
    const float sl2 = scale * 1.4426950408889634f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[Fa<D>::NB][4];
#pragma unroll
    for (int nb = 0; nb < Fa<D>::NB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nb][e] = 0.0f;
    for (int kb = 0; kb < nkb; kb++) {
        int cur = kb & 1;
        if (kb + 1 < nkb) {
            fa_load<D>(ks + (cur ^ 1) * Fa<D>::TILE, kh, (kb + 1) * FA_TILE, t);
            fa_load<D>(vs + (cur ^ 1) * Fa<D>::TILE, vh, (kb + 1) * FA_TILE, t);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16* kt = ks + cur * Fa<D>::TILE;
        const bf16* vt = vs + cur * Fa<D>::TILE;
        // Raw scores; the running max m is kept unscaled (scale > 0), and each probability costs
        // one FFMA and one ex2: p = 2^(s sl2 - m sl2).
        float s[8][4];
        fa_abt<D>(s, qa, kt);
        if (!fa_tile_visible(q0, kb * FA_TILE, t, causal)) fa_mask<true>(s, qi0, kb * FA_TILE, cq, t, causal, -INFINITY);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nb][e]);
        float alpha[2], mref[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(m[r], mx[r]);
            mref[r] = mnew == -INFINITY ? 0.0f : mnew * sl2;
            alpha[r] = fa_exp2(fmaf(m[r], sl2, -mref[r]));
            m[r] = mnew;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = fa_exp2(fmaf(s[nb][e], sl2, -mref[e >> 1]));
                s[nb][e] = p;
                l[e >> 1] += p;
            }
#pragma unroll
        for (int nb = 0; nb < Fa<D>::NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[nb][e] *= alpha[e >> 1];
        fa_pv<D>(o, s, vt);
        __syncthreads();
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.0f / l[r];
        int qi = qi0 + 8 * r;
        if (cq == 0 && qi < t) lse[((u64)b * nh + h) * t + qi] = m[r] * sl2 + log2f(l[r]);
    }
    fa_store<D>(out + (u64)b * t * c, c, h * D, q0 + warp * 16, t, o, inv[0], inv[1]);
}

// delta (B, NH, T) = rowsum(BF16(dout) * out) per head: the softmax backward's correction term.
// dout holds f32 values, or BF16 values with dout_bf16 (proj's dgrad output may be stored so).
// Launch: one warp per (b, t, h) row, 8 warps per block.
extern "C" __global__ void flash_bwd_delta(float* __restrict__ delta, const void* __restrict__ dout, int dout_bf16,
                                           const float* __restrict__ out, int b, int t, int nh, int d) {
    u64 row = blockIdx.x * 8ull + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= (u64)b * t * nh) return;
    int h = (int)(row % nh);
    u64 bt = row / nh;
    u64 g0 = bt * nh * d + (u64)h * d;
    const float* y = out + bt * nh * d + (u64)h * d;
    float s = 0.0f;
    for (int i = lane; i < d; i += 32) s += __bfloat162float(__float2bfloat16_rn(load_value(dout, g0 + i, dout_bf16))) * y[i];
    s = warp_sum(s);
    if (lane == 0) {
        int tt = (int)(bt % t);
        u64 bb = bt / t;
        delta[(bb * nh + h) * t + tt] = s;
    }
}

// lse2 and delta of query row qi of a head (0 past T).
__device__ __forceinline__ float fa_row(const float* v, int qi, int t) { return qi < t ? __ldg(v + qi) : 0.0f; }

// dK and dV. Grid (ceil(T/64), KVH, B), FA_THREADS threads; warp w owns keys 16w .. 16w+15 of the
// block's tile and computes the transposed products (keys as rows, queries as columns):
// dV = sum over the group's heads and query tiles of P^T dO; dK = scale * sum dS^T Q. The (head,
// query tile) pairs run as one sequence, so the next pair's q and dout tiles load during this one.
template <int D>
__device__ void flash_bwd_dkdv(float* __restrict__ dqkv, const bf16* __restrict__ q, const bf16* __restrict__ k,
                               const bf16* __restrict__ v, const bf16* __restrict__ dy, const float* __restrict__ lse,
                               const float* __restrict__ delta, int t, int nh, int kvh, float scale, int causal) {
    extern __shared__ __align__(128) unsigned char fa_smem[];
    bf16* ks = reinterpret_cast<bf16*>(fa_smem);
    bf16* vs = ks + Fa<D>::TILE;
    bf16* qs = vs + Fa<D>::TILE;       // two buffers
    bf16* dos = qs + 2 * Fa<D>::TILE;  // two buffers
    // lse2 and delta of the query tile of each buffer, staged with it.
    __shared__ float rows_s[2][2][FA_TILE];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    int kb = blockIdx.x, grp = blockIdx.y, b = blockIdx.z;
    int rep = nh / kvh;
    int c = nh * D, w = c + 2 * kvh * D;
    int k0 = kb * FA_TILE;
    int ntiles = (t + FA_TILE - 1) / FA_TILE;
    int qb0 = causal ? kb : 0;
    int per_head = ntiles - qb0;
    int iters = rep * per_head;
    fa_load<D>(ks, k + ((u64)b * kvh + grp) * t * D, k0, t);
    fa_load<D>(vs, v + ((u64)b * kvh + grp) * t * D, k0, t);
    cp_async_commit();
    // The (head, query tile) of iteration i.
    auto head_of = [&](int i) { return grp * rep + i / per_head; };
    auto tile_of = [&](int i) { return qb0 + i % per_head; };
    // Stages iteration i's q and dout tiles (cp.async) and its lse2 and delta rows into buffer buf.
    auto stage = [&](int i, int buf) {
        u64 hr = ((u64)b * nh + head_of(i)) * t;
        int q0 = tile_of(i) * FA_TILE;
        fa_load<D>(qs + buf * Fa<D>::TILE, q + hr * D, q0, t);
        fa_load<D>(dos + buf * Fa<D>::TILE, dy + hr * D, q0, t);
        if (threadIdx.x < FA_TILE) {
            rows_s[buf][0][threadIdx.x] = fa_row(lse + hr, q0 + threadIdx.x, t);
            rows_s[buf][1][threadIdx.x] = fa_row(delta + hr, q0 + threadIdx.x, t);
        }
    };
    stage(0, 0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    u32 ka[Fa<D>::KS][4], va[Fa<D>::KS][4];
#pragma unroll
    for (int kk = 0; kk < Fa<D>::KS; kk++) {
        load_a<D>(ka[kk], ks, warp * 16, kk * 16);
        load_a<D>(va[kk], vs, warp * 16, kk * 16);
    }
    float dk[Fa<D>::NB][4], dv[Fa<D>::NB][4];
#pragma unroll
    for (int nb = 0; nb < Fa<D>::NB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[nb][e] = dv[nb][e] = 0.0f;
    int kj0 = k0 + warp * 16 + g;
    const float sl2 = scale * 1.4426950408889634f;
    for (int it = 0; it < iters; it++) {
        int cur = it & 1;
        if (it + 1 < iters) stage(it + 1, cur ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16* qt = qs + cur * Fa<D>::TILE;
        const bf16* dt = dos + cur * Fa<D>::TILE;
        int q0 = tile_of(it) * FA_TILE;
        const float* lse_t = rows_s[cur][0];
        const float* delta_t = rows_s[cur][1];
        // P^T = exp2(K_w Q^T scaled - lse2[query]).
        float p[8][4], ds[8][4];
        fa_abt<D>(p, ka, qt);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) p[nb][e] = fa_exp2(fmaf(p[nb][e], sl2, -lse_t[nb * 8 + 2 * cq + (e & 1)]));
        if (!fa_tile_visible(q0, k0, t, causal)) fa_mask<false>(p, kj0, q0, cq, t, causal, 0.0f);
        // dS^T = P^T (V_w dO^T - delta[query]).
        fa_abt<D>(ds, va, dt);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) ds[nb][e] = p[nb][e] * (ds[nb][e] - delta_t[nb * 8 + 2 * cq + (e & 1)]);
        fa_pv<D>(dv, p, dt);
        fa_pv<D>(dk, ds, qt);
        __syncthreads();
    }
    int krow0 = k0 + warp * 16;
    float* dst = dqkv + (u64)b * t * w;
    fa_store<D>(dst, w, c + grp * D, krow0, t, dk, scale, scale);
    fa_store<D>(dst, w, c + kvh * D + grp * D, krow0, t, dv, 1.0f, 1.0f);
}

// dQ. Grid (ceil(T/64), NH, B), FA_THREADS threads; warp w owns query rows 16w .. 16w+15.
// dQ = scale * sum over key tiles of dS K.
template <int D>
__device__ void flash_bwd_dq(float* __restrict__ dqkv, const bf16* __restrict__ q, const bf16* __restrict__ k,
                             const bf16* __restrict__ v, const bf16* __restrict__ dy, const float* __restrict__ lse,
                             const float* __restrict__ delta, int t, int nh, int kvh, float scale, int causal) {
    extern __shared__ __align__(128) unsigned char fa_smem[];
    bf16* qs = reinterpret_cast<bf16*>(fa_smem);
    bf16* dos = qs + Fa<D>::TILE;
    bf16* ks = dos + Fa<D>::TILE;      // two buffers
    bf16* vs = ks + 2 * Fa<D>::TILE;   // two buffers
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int grp = h / (nh / kvh);
    int c = nh * D, w = c + 2 * kvh * D;
    int q0 = qb * FA_TILE;
    int ntiles = (t + FA_TILE - 1) / FA_TILE;
    int nkb = causal ? min(qb + 1, ntiles) : ntiles;
    u64 hrow = ((u64)b * nh + h) * t;
    const bf16* kh = k + ((u64)b * kvh + grp) * t * D;
    const bf16* vh = v + ((u64)b * kvh + grp) * t * D;
    fa_load<D>(qs, q + hrow * D, q0, t);
    fa_load<D>(dos, dy + hrow * D, q0, t);
    cp_async_commit();
    fa_load<D>(ks, kh, 0, t);
    fa_load<D>(vs, vh, 0, t);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    u32 qa[Fa<D>::KS][4], da[Fa<D>::KS][4];
#pragma unroll
    for (int kk = 0; kk < Fa<D>::KS; kk++) {
        load_a<D>(qa[kk], qs, warp * 16, kk * 16);
        load_a<D>(da[kk], dos, warp * 16, kk * 16);
    }
    int qi0 = q0 + warp * 16 + g;
    float lse_r[2] = {fa_row(lse + hrow, qi0, t), fa_row(lse + hrow, qi0 + 8, t)};
    float dd_r[2] = {fa_row(delta + hrow, qi0, t), fa_row(delta + hrow, qi0 + 8, t)};
    float dq[Fa<D>::NB][4];
#pragma unroll
    for (int nb = 0; nb < Fa<D>::NB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) dq[nb][e] = 0.0f;
    const float sl2 = scale * 1.4426950408889634f;
    for (int kb = 0; kb < nkb; kb++) {
        int cur = kb & 1;
        if (kb + 1 < nkb) {
            fa_load<D>(ks + (cur ^ 1) * Fa<D>::TILE, kh, (kb + 1) * FA_TILE, t);
            fa_load<D>(vs + (cur ^ 1) * Fa<D>::TILE, vh, (kb + 1) * FA_TILE, t);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16* kt = ks + cur * Fa<D>::TILE;
        const bf16* vt = vs + cur * Fa<D>::TILE;
        int k0 = kb * FA_TILE;
        float p[8][4], ds[8][4];
        fa_abt<D>(p, qa, kt);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) p[nb][e] = fa_exp2(fmaf(p[nb][e], sl2, -lse_r[e >> 1]));
        if (!fa_tile_visible(q0, k0, t, causal)) fa_mask<true>(p, qi0, k0, cq, t, causal, 0.0f);
        fa_abt<D>(ds, da, vt);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) ds[nb][e] = p[nb][e] * (ds[nb][e] - dd_r[e >> 1]);
        fa_pv<D>(dq, ds, kt);
        __syncthreads();
    }
    fa_store<D>(dqkv + (u64)b * t * w, w, h * D, q0 + warp * 16, t, dq, scale, scale);
}

#define FA_ENTRY(D)                                                                                                    \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                                           \
        flash_fwd_d##D(float* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int t, int nh, int kvh,    \
                       float scale, int causal) {                                                                      \
        flash_fwd<D>(out, lse, q, k, v, t, nh, kvh, scale, causal);                                                    \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                                           \
        flash_bwd_dkdv_d##D(float* dqkv, const bf16* q, const bf16* k, const bf16* v, const bf16* dy,                  \
                            const float* lse, const float* delta, int t, int nh, int kvh, float scale, int causal) {   \
        flash_bwd_dkdv<D>(dqkv, q, k, v, dy, lse, delta, t, nh, kvh, scale, causal);                                   \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                                           \
        flash_bwd_dq_d##D(float* dqkv, const bf16* q, const bf16* k, const bf16* v, const bf16* dy,                    \
                          const float* lse, const float* delta, int t, int nh, int kvh, float scale, int causal) {     \
        flash_bwd_dq<D>(dqkv, q, k, v, dy, lse, delta, t, nh, kvh, scale, causal);                                     \
    }

FA_ENTRY(16)
FA_ENTRY(32)
FA_ENTRY(64)
FA_ENTRY(96)
FA_ENTRY(128)
