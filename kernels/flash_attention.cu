// Fused ("flash") attention, forward and backward, causal or not, with grouped-query heads, on BF16
// tensor cores (mma.sync m16n8k16, f32 accumulation). No (T x T) matrix is ever written to memory,
// and the scores, probabilities and their gradients never leave the registers.
//
// Layouts: q and dout (B, NH, T, D), k and v (B, KVH, T, D), BF16, each read through a FaTensor
// (its strides): BF16 qkv and dout rows in place, else the head-major matrices that attention.cu's
// attention_split_fwd / attention_split_bwd (f32 rows) or rope_split_fwd (RoPE) write in one pass;
// query head h reads kv head h / (NH/KVH). out (B, T, NH*D) and dqkv (B, T, (NH + 2 KVH) D) are rows of
// f32 values, or of BF16 values (out16, dqkv16: the backend's 16-bit buffers; not with RoPE's
// rotation at the store, whose values are not BF16 numbers).
// Tiles stream from global to shared memory with cp.async, double-buffered: the next tile loads
// while the current one is multiplied.
// Numerics: q, k, v, dout are the BF16 values the unfused path's cuBLAS GEMMs take; scores, the
// softmax, its running max and sum, and
// every accumulator are f32; the probabilities P (unnormalised, in [0, 1]) and the score gradients
// dS are rounded to BF16 before their products, as the unfused path rounds att and dpreatt.
// Outputs (out, dqkv) are rounded to BF16; given the RoPE table, the backward then rotates dq
// and dk back at the store (fa_store), the work of rope_bwd. The saved statistic is the base-2 log-sum-exp of the
// scaled scores, lse2 = m + log2(l) (B, NH, T): P = exp2(s * scale * log2(e) - lse2), one FFMA and
// one ex2.approx per probability (fa_exp2). Only the tiles a mask cuts (the causal diagonal, the
// ragged end of T) test each element (fa_tile_visible); the others skip the test.
//
// Tiles: 64 keys per step; a warp owns 16 rows (queries, or keys for dK/dV) of each of the
// block's 64-row tiles. dQ blocks take Fa<D>::MT_DQ query tiles (2 for D <= 64), so that each K
// or V fragment loaded from shared memory feeds two MMAs and a warp has two independent chains in
// flight (at llama-1b: dQ 1 ms a step faster, the same bits). The forward takes MT_FWD query tiles
// as well (2 for D <= 64: 9% faster at llama-1b, bench/flash_bench.py); its running sums and
// log-sum-exp carry their roundings written out, so that the bits do not depend on MT. dK/dV
// blocks take one key tile (the registers of a second would spill).
// D (the head size) is a template parameter (16, 32, 64, 96, 128). Blocks: forward and dQ one per
// (head, batch, MT query tiles), dK/dV one per (kv head, batch, key tile) looping over the group's
// query heads; the tile is the grid's slowest index, so that the heaviest blocks under a causal
// mask start first (dispatched late, they ran on while the rest of the GPU idled). Every
// accumulation runs in a fixed order (no atomics): reruns are bit-identical, and a row's sums run
// in the same order whatever MT is.
// Fragments (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + c (g the group, c its thread);
// an accumulator holds (row g, cols 2c, 2c+1) and (row g+8, same cols) of a 16 x 8 tile; an A
// operand (16 x 16) holds rows g and g+8 at k = 2c, 2c+1 and 2c+8, 2c+9 — so an accumulator pair
// (two n-blocks) becomes an A operand in registers, as FlashAttention-2 does with P.
// Shared memory: BF16 tiles of 64 x (D+8): forward MT_FWD + 4 (q, two k and two v), dK/dV 6 (k and v
// resident, two q and two dout streaming), dQ 2 MT_DQ + 4 (q and dout resident, two k and two v)
// (capture/src/backend/cuda/attention.rs: flash_smem and flash_query_tiles mirror it).
#include "common.cuh"

#define FA_TILE 64
// Query tiles per block of the forward and of dQ, and blocks per SM the registers are capped for
// (FA_*_MIN_BLOCKS below), by head size; each can be set from outside (bench/flash_bench.py's
// variants compile with -D).
#ifndef FA_MT_FWD
#define FA_MT_FWD(D) ((D) <= 64 ? 2 : 1)
#endif
#ifndef FA_MT_DQ
#define FA_MT_DQ(D) ((D) <= 64 ? 2 : 1)
#endif
#define FA_WARPS 4
#define FA_THREADS (FA_WARPS * 32)

typedef __nv_bfloat16 bf16;

// Where the kernels read a (B, heads, T, D) BF16 tensor: element (b, h, t, d) lies at
// p[b * batch + h * head + t * row + d]. The head-major matrices of attention_split_fwd and
// rope_split_fwd have row = D and head = T * D; BF16 qkv and dout rows are read in place, with
// row = the rows' width and head = D (capture/src/backend/cuda/attention.rs: HeadTensor mirrors it,
// and checks that a batch's offsets, h * head + t * row + d, fit in 32 bits).
struct FaTensor {
    const bf16* p;
    long long batch;
    u32 head, row;
};

// Where batch b of x starts. A head's start is either a pointer (fa_head, where the kernel keeps
// it: k and v across the key loop) or an offset from its batch's (fa_load's `off`, where the head
// changes: dK/dV's query heads), which holds one register where a pointer holds two.
__device__ __forceinline__ const bf16* fa_batch(const FaTensor& x, int b) { return x.p + (long long)b * x.batch; }
// Where the (T, D) matrix of head h of batch b starts.
__device__ __forceinline__ const bf16* fa_head(const FaTensor& x, int b, int h) { return fa_batch(x, b) + (u32)h * x.head; }

template <int D> struct Fa {
    static constexpr int LD = D + 8;       // BF16 tile row stride (16-byte rows, no bank conflicts)
    static constexpr int TILE = FA_TILE * LD;
    static constexpr int KS = D / 16;      // k-steps over the head dimension
    static constexpr int NB = D / 8;       // n-blocks of 8 over the head dimension
    // 64-row query tiles per block: MT_FWD in the forward, MT_DQ in dQ (attention.rs:
    // flash_query_tiles mirrors both).
    static constexpr int MT_FWD = FA_MT_FWD(D);
    static constexpr int MT_DQ = FA_MT_DQ(D);
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
// 4 bytes, through L1: the dK/dV kernel stages a query tile's lse2 and delta rows so.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
    u32 a = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Starts loading rows row0 .. row0+63 of a head's (T, D) BF16 matrix, at `off` from `src` with its
// rows `ld` values apart, into a tile; rows past T are zero-filled. All threads of the block take
// part; the caller commits and waits.
template <int D>
__device__ __forceinline__ void fa_load(bf16* dst, const bf16* src, u32 off, u32 ld, int row0, int t) {
    constexpr int V = D / 8;
    for (int e = threadIdx.x; e < FA_TILE * V; e += FA_THREADS) {
        int r = e / V, c = (e % V) * 8;
        bf16* d = dst + r * Fa<D>::LD + c;
        if (row0 + r < t) cp_async16(d, src + (off + (u32)(row0 + r) * ld + c));
        else *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// One step of a loop over key tiles that streams k and v through two buffers each (ks, vs): starts
// loading tile kb + 1 into the other buffer, waits for tile kb's, and returns its buffer (0 or 1)
// after the block's barrier. The forward and dQ loop so.
template <int D>
__device__ __forceinline__ int fa_stream_kv(int kb, int nkb, bf16* ks, bf16* vs, const bf16* kh, u32 kld, const bf16* vh,
                                            u32 vld, int t) {
    int cur = kb & 1;
    if (kb + 1 < nkb) {
        fa_load<D>(ks + (cur ^ 1) * Fa<D>::TILE, kh, 0, kld, (kb + 1) * FA_TILE, t);
        fa_load<D>(vs + (cur ^ 1) * Fa<D>::TILE, vh, 0, vld, (kb + 1) * FA_TILE, t);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    return cur;
}

// acc[i] (16 x 8 NBC) = a[I0 + i] (16 x D, a warp's A operands) times the transpose of rows c0 ..
// c0 + 8 NBC - 1 of a 64 x D tile, for i < N: each B fragment loaded feeds N MMAs. Each element
// sums over k in the same order whatever N is.
template <int D, int I0, int N, int NBC, int MT>
__device__ __forceinline__ void fa_abt(float (&acc)[N][NBC][4], const u32 (&a)[MT][Fa<D>::KS][4], const bf16* tile, int c0) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int nb = 0; nb < NBC; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][nb][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < Fa<D>::KS; kk++) {
#pragma unroll
        for (int np = 0; np < NBC / 2; np++) {
            u32 b[4];
            load_b_nk<D>(b, tile, c0 + np * 16, kk * 16);
#pragma unroll
            for (int i = 0; i < N; i++) {
                mma16816(acc[i][2 * np], a[I0 + i][kk], b[0], b[1]);
                mma16816(acc[i][2 * np + 1], a[I0 + i][kk], b[2], b[3]);
            }
        }
    }
}

// acc[I0 + i] (16 x D) += p[i] (16 x 8 NBC, accumulator layout, rounded to BF16 here) times rows
// k0 .. k0 + 8 NBC - 1 of a 64 x D tile, for i < N: each B fragment loaded feeds N MMAs. Each
// element adds the rows' 16-row steps in order, so a tile taken in parts sums as one.
template <int D, int I0, int N, int NBC, int MT>
__device__ __forceinline__ void fa_pv(float (&acc)[MT][Fa<D>::NB][4], const float (&p)[N][NBC][4], const bf16* tile, int k0) {
#pragma unroll
    for (int j = 0; j < NBC / 2; j++) {
        u32 a[N][4];
#pragma unroll
        for (int i = 0; i < N; i++) {
            a[i][0] = pack_bf16(p[i][2 * j][0], p[i][2 * j][1]);
            a[i][1] = pack_bf16(p[i][2 * j][2], p[i][2 * j][3]);
            a[i][2] = pack_bf16(p[i][2 * j + 1][0], p[i][2 * j + 1][1]);
            a[i][3] = pack_bf16(p[i][2 * j + 1][2], p[i][2 * j + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < Fa<D>::NB / 2; np++) {
            u32 b[4];
            load_b_kn<D>(b, tile, k0 + j * 16, np * 16);
#pragma unroll
            for (int i = 0; i < N; i++) {
                mma16816(acc[I0 + i][2 * np], a[i], b[0], b[1]);
                mma16816(acc[I0 + i][2 * np + 1], a[i], b[2], b[3]);
            }
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

// Sets x[nb][e] to `fill` where the mask hides it. x is a warp's 16 x 8 NBC accumulator: element
// (nb, e) lies in the warp's own row own0 + 8 (e >> 1) (g folded into own0) and the tile's column
// other0 + 8 nb + 2 cq + (e & 1). OWN_IS_QUERY: the own rows are queries and the columns keys
// (forward, dQ); otherwise the own rows are keys and the columns queries (dK/dV).
template <bool OWN_IS_QUERY, int NBC>
__device__ __forceinline__ void fa_mask(float (&x)[NBC][4], int own0, int other0, int cq, int t, int causal, float fill) {
#pragma unroll
    for (int nb = 0; nb < NBC; nb++)
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
// BF16, into a (T, w) matrix at column col, whose row 0 is value `base` of dst: f32 values, or BF16
// values with o16 (two to a word; never with rope_tab). With rope_tab (the RoPE table, (T, D): row t =
// [cos (D/2) | sin (D/2)]), each row's (j, j + D/2) pairs are then rotated back as rope_bwd rotates
// them (kernels/attention.cu: the same uncontracted f32 operations on the same BF16 values): the
// gradient before the rotation, with no pass of its own. A thread holds both columns of its pairs
// (n-blocks nb and nb + NB/2).
template <int D>
__device__ __forceinline__ void fa_store(void* dst, int o16, u64 base, int w, int col, int row0, int t, const float (&acc)[Fa<D>::NB][4],
                                         float scale0, float scale1, const float* __restrict__ rope_tab = nullptr) {
    int l = threadIdx.x & 31, g = l >> 2, c = l & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int tt = row0 + g + 8 * half;
        if (tt >= t) continue;
        float s = half ? scale1 : scale0;
        u64 i0 = base + (u64)tt * w + col + 2 * c;
        float y[Fa<D>::NB][2];
#pragma unroll
        for (int nb = 0; nb < Fa<D>::NB; nb++) {
            y[nb][0] = round_bf16(acc[nb][2 * half] * s);
            y[nb][1] = round_bf16(acc[nb][2 * half + 1] * s);
        }
        if (rope_tab != nullptr) {
            const float* cs = rope_tab + (u64)tt * D;
#pragma unroll
            for (int nb = 0; nb < Fa<D>::NB / 2; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int j = nb * 8 + 2 * c + e;
                    float y1 = y[nb][e], y2 = y[nb + Fa<D>::NB / 2][e];
                    rope_pair_bwd(y1, y2, __ldg(cs + j), __ldg(cs + D / 2 + j), y[nb][e], y[nb + Fa<D>::NB / 2][e]);
                }
        }
#pragma unroll
        for (int nb = 0; nb < Fa<D>::NB; nb++) {
            if (o16) *reinterpret_cast<u32*>((unsigned short*)dst + i0 + nb * 8) = pack_bf16(y[nb][0], y[nb][1]);
            else *reinterpret_cast<float2*>((float*)dst + i0 + nb * 8) = make_float2(y[nb][0], y[nb][1]);
        }
    }
}

// The key tiles query tile qt (64 rows) attends: all of them, only those up to its own (causal), or
// none when the tile lies past T.
__device__ __forceinline__ int fa_key_tiles(int qt, int t, int causal) {
    int ntiles = (t + FA_TILE - 1) / FA_TILE;
    if (qt * FA_TILE >= t) return 0;
    return causal ? min(qt + 1, ntiles) : ntiles;
}

// nk[i]: the key tiles query tile i of block qb (MT tiles of 64 rows) attends (fa_key_tiles);
// returns the most of them, the block's key-tile loop count.
template <int MT>
__device__ __forceinline__ int fa_block_key_tiles(int qb, int t, int causal, int (&nk)[MT]) {
    int nkb = 0;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        nk[i] = fa_key_tiles(qb * MT + i, t, causal);
        nkb = max(nkb, nk[i]);
    }
    return nkb;
}

// Which of the block's MT query tiles attend key tile kb (nk[i]: tile i's key tiles,
// fa_key_tiles): FA_BOTH (every tile), FA_FIRST (tile 0 only) or FA_LAST (tile MT - 1 only). Tile 0
// attends a prefix of the key tiles tile 1 attends, unless tile 1 lies past T, so with MT = 2 these
// are the only cases. The answer is the same for every warp of the block.
#define FA_BOTH 0
#define FA_FIRST 1
#define FA_LAST 2
template <int MT>
__device__ __forceinline__ int fa_attending(int kb, const int (&nk)[MT]) {
    if (kb < nk[0] && kb < nk[MT - 1]) return FA_BOTH;
    return kb < nk[0] ? FA_FIRST : FA_LAST;
}

// One key tile of the forward for query tiles I0 .. I0 + N - 1 of the warp's MT: the scores, the
// online softmax (running max m, sum l, rescaled output o) and o += P V. Per query tile the
// operations are those of a one-tile block, in the same order.
template <int D, int I0, int N, int MT>
__device__ __forceinline__ void fa_fwd_tile(float (&o)[MT][Fa<D>::NB][4], float (&m)[MT][2], float (&l)[MT][2],
                                            const u32 (&qa)[MT][Fa<D>::KS][4], const bf16* kt, const bf16* vt, int q0,
                                            int k0, int qi0, int cq, int t, int causal, float sl2) {
    // Raw scores; the running max m is kept unscaled (scale > 0), and each probability costs one
    // FFMA and one ex2: p = 2^(s sl2 - m sl2).
    float s[N][8][4];
    fa_abt<D, I0>(s, qa, kt, 0);
#pragma unroll
    for (int i = 0; i < N; i++) {
        int tq0 = q0 + (I0 + i) * FA_TILE;
        if (!fa_tile_visible(tq0, k0, t, causal)) fa_mask<true>(s[i], qi0 + (I0 + i) * FA_TILE, k0, cq, t, causal, -INFINITY);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[i][nb][e]);
        float alpha[2], mref[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float& mr = m[I0 + i][r];
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(mr, mx[r]);
            mref[r] = mnew == -INFINITY ? 0.0f : mnew * sl2;
            alpha[r] = fa_exp2(fmaf(mr, sl2, -mref[r]));
            mr = mnew;
        }
        // l = l alpha + p (one FMA, the row's first probability), then + p for the others in order:
        // written out, so that every MT rounds the running sums as MT = 1 always has.
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = fa_exp2(fmaf(s[i][nb][e], sl2, -mref[e >> 1]));
                s[i][nb][e] = p;
                float& lr = l[I0 + i][e >> 1];
                lr = nb == 0 && (e & 1) == 0 ? __fmaf_rn(lr, alpha[e >> 1], p) : __fadd_rn(lr, p);
            }
#pragma unroll
        for (int nb = 0; nb < Fa<D>::NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[I0 + i][nb][e] *= alpha[e >> 1];
    }
    fa_pv<D, I0>(o, s, vt, 0);
}

// Forward. Grid (NH, B, ceil(T / (64 MT))), FA_THREADS threads, the last query tiles (the heaviest
// under a causal mask) first; warp w owns query rows 16w .. 16w+15 of each of the block's MT query
// tiles.
template <int D>
__device__ void flash_fwd(void* __restrict__ out, int out16, float* __restrict__ lse, const FaTensor& q, const FaTensor& k, const FaTensor& v,
                          int t, int nh, int kvh, float scale, int causal) {
    constexpr int MT = Fa<D>::MT_FWD;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    bf16* qs = reinterpret_cast<bf16*>(fa_smem);  // MT tiles
    bf16* ks = qs + MT * Fa<D>::TILE;             // two buffers
    bf16* vs = ks + 2 * Fa<D>::TILE;              // two buffers
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;  // heaviest tiles first
    int grp = h / (nh / kvh);
    int c = nh * D;
    const bf16* qh = fa_head(q, b, h);
    const bf16* kh = fa_head(k, b, grp);
    const bf16* vh = fa_head(v, b, grp);
    int q0 = qb * MT * FA_TILE;
    int nk[MT];
    int nkb = fa_block_key_tiles<MT>(qb, t, causal, nk);
#pragma unroll
    for (int i = 0; i < MT; i++) fa_load<D>(qs + i * Fa<D>::TILE, qh, 0, q.row, q0 + i * FA_TILE, t);
    cp_async_commit();
    fa_load<D>(ks, kh, 0, k.row, 0, t);
    fa_load<D>(vs, vh, 0, v.row, 0, t);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    u32 qa[MT][Fa<D>::KS][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int kk = 0; kk < Fa<D>::KS; kk++) load_a<D>(qa[i][kk], qs + i * Fa<D>::TILE, warp * 16, kk * 16);
    int qi0 = q0 + warp * 16 + g;
    const float sl2 = scale * 1.4426950408889634f;
    float m[MT][2], l[MT][2];
    float o[MT][Fa<D>::NB][4];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        m[i][0] = m[i][1] = -INFINITY;
        l[i][0] = l[i][1] = 0.0f;
#pragma unroll
        for (int nb = 0; nb < Fa<D>::NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[i][nb][e] = 0.0f;
    }
    for (int kb = 0; kb < nkb; kb++) {
        int cur = fa_stream_kv<D>(kb, nkb, ks, vs, kh, k.row, vh, v.row, t);
        const bf16* kt = ks + cur * Fa<D>::TILE;
        const bf16* vt = vs + cur * Fa<D>::TILE;
        int k0 = kb * FA_TILE, which = MT == 1 ? FA_BOTH : fa_attending<MT>(kb, nk);
        if (MT == 1 || which == FA_BOTH) fa_fwd_tile<D, 0, MT>(o, m, l, qa, kt, vt, q0, k0, qi0, cq, t, causal, sl2);
        else if (which == FA_FIRST) fa_fwd_tile<D, 0, 1>(o, m, l, qa, kt, vt, q0, k0, qi0, cq, t, causal, sl2);
        else fa_fwd_tile<D, MT - 1, 1>(o, m, l, qa, kt, vt, q0, k0, qi0, cq, t, causal, sl2);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 1);
            l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 2);
            inv[r] = 1.0f / l[i][r];
            int qi = qi0 + i * FA_TILE + 8 * r;
            // lse2 = m sl2 + log2(l): one FMA for the first row, a product then a sum for the second,
            // the roundings the compiler chose for MT = 1, written out so that every MT keeps them.
            float lg = log2f(l[i][r]);
            float lse2 = r == 0 ? __fmaf_rn(m[i][r], sl2, lg) : __fadd_rn(__fmul_rn(m[i][r], sl2), lg);
            if (cq == 0 && qi < t) lse[((u64)b * nh + h) * t + qi] = lse2;
        }
        fa_store<D>(out, out16, (u64)b * t * c, c, h * D, q0 + i * FA_TILE + warp * 16, t, o[i], inv[0], inv[1]);
    }
}

// delta (B, NH, T) = rowsum(BF16(dout) * out) per head: the softmax backward's correction term.
// dout holds f32 values, or BF16 values with dout_bf16 (proj's dgrad output may be stored so), and
// out likewise with out_bf16 (the forward's out16). d <= 128 (FLASH_HEAD_SIZES), B T NH < 2^32.
// Launch: one warp per FA_DELTA_ROWS consecutive (b, t, h) rows (the rows of a token's heads lie
// one after the other), 8 warps per block. Each row is summed as one warp alone would sum it: lane
// l adds the products of elements l, l + 32, ... in order, then the warp's xor tree. The warp's
// loads are all issued before the first product: every address is clamped into the tensor, and
// what lies past a row's d values or past the last row is zeroed after its load (a product of
// zeros adds nothing: a sum that starts at +0 is never -0). Storage is a template parameter, so
// that no load sits behind a branch. (One row a warp, with 64-bit index divisions, ran at a fifth
// of the memory's bandwidth.)
#define FA_DELTA_ROWS 4
template <int XB, int YB, int JN>
__device__ __forceinline__ void delta_rows(float* __restrict__ delta, const void* __restrict__ dout, const void* __restrict__ out,
                                           int b, int t, int nh, int d) {
    u32 rows = (u32)b * (u32)t * (u32)nh;
    u32 row0 = (blockIdx.x * 8u + (threadIdx.x >> 5)) * FA_DELTA_ROWS;
    int lane = threadIdx.x & 31;
    if (row0 >= rows) return;
    float x[FA_DELTA_ROWS][JN], y[FA_DELTA_ROWS][JN];
#pragma unroll
    for (int r = 0; r < FA_DELTA_ROWS; r++) {
        // Row (b, t, h) = (b t) nh + h starts at element row * d.
        u64 g0 = (u64)min(row0 + r, rows - 1) * d;
#pragma unroll
        for (int j = 0; j < JN; j++) {
            u64 g = g0 + min(lane + 32 * j, d - 1);
            x[r][j] = XB ? __uint_as_float((u32)__ldg((const unsigned short*)dout + g) << 16) : __ldg((const float*)dout + g);
            y[r][j] = YB ? __uint_as_float((u32)__ldg((const unsigned short*)out + g) << 16) : __ldg((const float*)out + g);
        }
    }
    float s[FA_DELTA_ROWS];
#pragma unroll
    for (int r = 0; r < FA_DELTA_ROWS; r++) {
        s[r] = 0.0f;
        bool live = row0 + r < rows;
#pragma unroll
        for (int j = 0; j < JN; j++) {
            bool in = live && lane + 32 * j < d;
            s[r] += __bfloat162float(__float2bfloat16_rn(in ? x[r][j] : 0.0f)) * (in ? y[r][j] : 0.0f);
        }
    }
    // warp_sum's tree, the rows' steps interleaved.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < FA_DELTA_ROWS; r++) s[r] += __shfl_xor_sync(0xffffffffu, s[r], o);
    // Every lane holds each row's sum (the xor tree adds the same pairs in every lane); lane
    // r < FA_DELTA_ROWS writes row r's.
    if (lane < FA_DELTA_ROWS) {
        u32 row = row0 + lane;
        float v = s[0];
#pragma unroll
        for (int r = 1; r < FA_DELTA_ROWS; r++) v = lane == r ? s[r] : v;
        if (row < rows) {
            u32 h = row % (u32)nh, bt = row / (u32)nh;
            u32 tt = bt % (u32)t, bb = bt / (u32)t;
            delta[((u64)bb * nh + h) * t + tt] = v;
        }
    }
}

// The rows of one storage pair, JN = ceil(d / 32) values a lane a row.
template <int XB, int YB>
__device__ __forceinline__ void delta_rows_d(float* __restrict__ delta, const void* __restrict__ dout, const void* __restrict__ out,
                                             int b, int t, int nh, int d) {
    if (d <= 32) delta_rows<XB, YB, 1>(delta, dout, out, b, t, nh, d);
    else if (d <= 64) delta_rows<XB, YB, 2>(delta, dout, out, b, t, nh, d);
    else if (d <= 96) delta_rows<XB, YB, 3>(delta, dout, out, b, t, nh, d);
    else delta_rows<XB, YB, 4>(delta, dout, out, b, t, nh, d);
}

// Launch: ceil(B T NH / (8 FA_DELTA_ROWS)) blocks of 256 threads.
extern "C" __global__ void flash_bwd_delta(float* __restrict__ delta, const void* __restrict__ dout, int dout_bf16,
                                           const void* __restrict__ out, int out_bf16, int b, int t, int nh, int d) {
    if (dout_bf16) {
        if (out_bf16) delta_rows_d<1, 1>(delta, dout, out, b, t, nh, d);
        else delta_rows_d<1, 0>(delta, dout, out, b, t, nh, d);
    } else {
        if (out_bf16) delta_rows_d<0, 1>(delta, dout, out, b, t, nh, d);
        else delta_rows_d<0, 0>(delta, dout, out, b, t, nh, d);
    }
}

// lse2 and delta of query row qi of a head (0 past T).
__device__ __forceinline__ float fa_row(const float* v, int qi, int t) { return qi < t ? __ldg(v + qi) : 0.0f; }

// dK and dV. Grid (KVH, B, ceil(T/64)), FA_THREADS threads, the first key tiles (the heaviest under
// a causal mask) first; warp w owns keys 16w .. 16w+15 of the block's tile and computes the
// transposed products (keys as rows, queries as columns): dV = sum over the group's heads and
// query tiles of P^T dO; dK = scale * sum dS^T Q. The (head, query tile) pairs run as one
// sequence, so the next pair's q and dout tiles load during this one.
template <int D>
__device__ void flash_bwd_dkdv(void* __restrict__ dqkv, int dqkv16, const FaTensor& q, const FaTensor& k, const FaTensor& v,
                               const FaTensor& dy, const float* __restrict__ lse,
                               const float* __restrict__ delta, int t, int nh, int kvh, float scale, int causal,
                               const float* __restrict__ rope_tab) {
    extern __shared__ __align__(128) unsigned char fa_smem[];
    bf16* ks = reinterpret_cast<bf16*>(fa_smem);
    bf16* vs = ks + Fa<D>::TILE;
    bf16* qs = vs + Fa<D>::TILE;       // two buffers
    bf16* dos = qs + 2 * Fa<D>::TILE;  // two buffers
    // lse2 and delta of the query tile of each buffer, staged with it.
    __shared__ float rows_s[2][2][FA_TILE];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    int grp = blockIdx.x, b = blockIdx.y, kb = blockIdx.z;  // heaviest tiles first
    int rep = nh / kvh;
    int c = nh * D, w = c + 2 * kvh * D;
    int k0 = kb * FA_TILE;
    int ntiles = (t + FA_TILE - 1) / FA_TILE;
    int qb0 = causal ? kb : 0;
    int per_head = ntiles - qb0;
    int iters = rep * per_head;
    fa_load<D>(ks, fa_batch(k, b), grp * k.head, k.row, k0, t);
    fa_load<D>(vs, fa_batch(v, b), grp * v.head, v.row, k0, t);
    cp_async_commit();
    // The (head, query tile) of iteration i.
    auto head_of = [&](int i) { return grp * rep + i / per_head; };
    auto tile_of = [&](int i) { return qb0 + i % per_head; };
    // Stages iteration i's q and dout tiles (cp.async) and its lse2 and delta rows into buffer buf.
    auto stage = [&](int i, int buf) {
        int hd = head_of(i);
        u64 hr = ((u64)b * nh + hd) * t;
        int q0 = tile_of(i) * FA_TILE;
        fa_load<D>(qs + buf * Fa<D>::TILE, fa_batch(q, b), hd * q.head, q.row, q0, t);
        fa_load<D>(dos + buf * Fa<D>::TILE, fa_batch(dy, b), hd * dy.head, dy.row, q0, t);
        // Copied asynchronously with the tiles (a plain load would stall its warp until the value
        // arrived); rows past T are 0.
        if (threadIdx.x < FA_TILE) {
            int qi = q0 + threadIdx.x;
            if (qi < t) {
                cp_async4(&rows_s[buf][0][threadIdx.x], lse + hr + qi);
                cp_async4(&rows_s[buf][1][threadIdx.x], delta + hr + qi);
            } else {
                rows_s[buf][0][threadIdx.x] = rows_s[buf][1][threadIdx.x] = 0.0f;
            }
        }
    };
    stage(0, 0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    u32 ka[1][Fa<D>::KS][4], va[1][Fa<D>::KS][4];
#pragma unroll
    for (int kk = 0; kk < Fa<D>::KS; kk++) {
        load_a<D>(ka[0][kk], ks, warp * 16, kk * 16);
        load_a<D>(va[0][kk], vs, warp * 16, kk * 16);
    }
    float dk[1][Fa<D>::NB][4], dv[1][Fa<D>::NB][4];
#pragma unroll
    for (int nb = 0; nb < Fa<D>::NB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[0][nb][e] = dv[0][nb][e] = 0.0f;
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
        // In two halves of 32 queries (the registers of the full tile's P and dS would cost a block
        // per SM); dV and dK add Q's and dO's 16-row steps in the one-pass order.
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int c0 = half * 32;
            // P^T = exp2(K_w Q^T scaled - lse2[query]).
            float p[1][4][4], ds[1][4][4];
            fa_abt<D, 0>(p, ka, qt, c0);
#pragma unroll
            for (int nb = 0; nb < 4; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) p[0][nb][e] = fa_exp2(fmaf(p[0][nb][e], sl2, -lse_t[c0 + nb * 8 + 2 * cq + (e & 1)]));
            if (!fa_tile_visible(q0, k0, t, causal)) fa_mask<false>(p[0], kj0, q0 + c0, cq, t, causal, 0.0f);
            // dS^T = P^T (V_w dO^T - delta[query]).
            fa_abt<D, 0>(ds, va, dt, c0);
#pragma unroll
            for (int nb = 0; nb < 4; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) ds[0][nb][e] = p[0][nb][e] * (ds[0][nb][e] - delta_t[c0 + nb * 8 + 2 * cq + (e & 1)]);
            fa_pv<D, 0>(dv, p, dt, c0);
            fa_pv<D, 0>(dk, ds, qt, c0);
        }
        __syncthreads();
    }
    int krow0 = k0 + warp * 16;
    u64 base = (u64)b * t * w;
    fa_store<D>(dqkv, dqkv16, base, w, c + grp * D, krow0, t, dk[0], scale, scale, rope_tab);
    fa_store<D>(dqkv, dqkv16, base, w, c + kvh * D + grp * D, krow0, t, dv[0], 1.0f, 1.0f);
}

// One key tile of dQ for query tiles I0 .. I0 + N - 1 of the warp's MT, in two halves of 32 keys
// (the registers of two query tiles' full 64-key P and dS would spill): P and dS of the half, then
// dq += dS K over its keys. The halves add K's 16-row steps in the one-tile order.
template <int D, int I0, int N, int MT>
__device__ __forceinline__ void fa_dq_tile(float (&dq)[MT][Fa<D>::NB][4], const u32 (&qa)[MT][Fa<D>::KS][4],
                                           const u32 (&da)[MT][Fa<D>::KS][4], const float (&lse_r)[MT][2],
                                           const float (&dd_r)[MT][2], const bf16* kt, const bf16* vt, int q0, int k0,
                                           int qi0, int cq, int t, int causal, float sl2) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int c0 = half * 32;
        float p[N][4][4], ds[N][4][4];
        fa_abt<D, I0>(p, qa, kt, c0);
#pragma unroll
        for (int i = 0; i < N; i++) {
#pragma unroll
            for (int nb = 0; nb < 4; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) p[i][nb][e] = fa_exp2(fmaf(p[i][nb][e], sl2, -lse_r[I0 + i][e >> 1]));
            int tq0 = q0 + (I0 + i) * FA_TILE;
            if (!fa_tile_visible(tq0, k0, t, causal)) fa_mask<true>(p[i], qi0 + (I0 + i) * FA_TILE, k0 + c0, cq, t, causal, 0.0f);
        }
        fa_abt<D, I0>(ds, da, vt, c0);
#pragma unroll
        for (int i = 0; i < N; i++)
#pragma unroll
            for (int nb = 0; nb < 4; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) ds[i][nb][e] = p[i][nb][e] * (ds[i][nb][e] - dd_r[I0 + i][e >> 1]);
        fa_pv<D, I0>(dq, ds, kt, c0);
    }
}

// dQ. Grid (NH, B, ceil(T / (64 MT))), FA_THREADS threads, the last query tiles first (as the
// forward); warp w owns query rows 16w .. 16w+15 of each of the block's MT query tiles. dQ = scale * sum over key tiles of dS K.
template <int D>
__device__ void flash_bwd_dq(void* __restrict__ dqkv, int dqkv16, const FaTensor& q, const FaTensor& k, const FaTensor& v,
                             const FaTensor& dy, const float* __restrict__ lse,
                             const float* __restrict__ delta, int t, int nh, int kvh, float scale, int causal,
                             const float* __restrict__ rope_tab) {
    constexpr int MT = Fa<D>::MT_DQ;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    bf16* qs = reinterpret_cast<bf16*>(fa_smem);  // MT tiles
    bf16* dos = qs + MT * Fa<D>::TILE;            // MT tiles
    bf16* ks = dos + MT * Fa<D>::TILE;            // two buffers
    bf16* vs = ks + 2 * Fa<D>::TILE;              // two buffers
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;  // heaviest tiles first
    int grp = h / (nh / kvh);
    int c = nh * D, w = c + 2 * kvh * D;
    int q0 = qb * MT * FA_TILE;
    int nk[MT];
    int nkb = fa_block_key_tiles<MT>(qb, t, causal, nk);
    u64 hrow = ((u64)b * nh + h) * t;
    const bf16* kh = fa_head(k, b, grp);
    const bf16* vh = fa_head(v, b, grp);
#pragma unroll
    for (int i = 0; i < MT; i++) {
        fa_load<D>(qs + i * Fa<D>::TILE, fa_batch(q, b), h * q.head, q.row, q0 + i * FA_TILE, t);
        fa_load<D>(dos + i * Fa<D>::TILE, fa_batch(dy, b), h * dy.head, dy.row, q0 + i * FA_TILE, t);
    }
    cp_async_commit();
    fa_load<D>(ks, kh, 0, k.row, 0, t);
    fa_load<D>(vs, vh, 0, v.row, 0, t);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    u32 qa[MT][Fa<D>::KS][4], da[MT][Fa<D>::KS][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int kk = 0; kk < Fa<D>::KS; kk++) {
            load_a<D>(qa[i][kk], qs + i * Fa<D>::TILE, warp * 16, kk * 16);
            load_a<D>(da[i][kk], dos + i * Fa<D>::TILE, warp * 16, kk * 16);
        }
    int qi0 = q0 + warp * 16 + g;
    float lse_r[MT][2], dd_r[MT][2];
    float dq[MT][Fa<D>::NB][4];
#pragma unroll
    for (int i = 0; i < MT; i++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            lse_r[i][r] = fa_row(lse + hrow, qi0 + i * FA_TILE + 8 * r, t);
            dd_r[i][r] = fa_row(delta + hrow, qi0 + i * FA_TILE + 8 * r, t);
        }
#pragma unroll
        for (int nb = 0; nb < Fa<D>::NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) dq[i][nb][e] = 0.0f;
    }
    const float sl2 = scale * 1.4426950408889634f;
    for (int kb = 0; kb < nkb; kb++) {
        int cur = fa_stream_kv<D>(kb, nkb, ks, vs, kh, k.row, vh, v.row, t);
        const bf16* kt = ks + cur * Fa<D>::TILE;
        const bf16* vt = vs + cur * Fa<D>::TILE;
        int k0 = kb * FA_TILE, which = MT == 1 ? FA_BOTH : fa_attending<MT>(kb, nk);
        if (MT == 1 || which == FA_BOTH) fa_dq_tile<D, 0, MT>(dq, qa, da, lse_r, dd_r, kt, vt, q0, k0, qi0, cq, t, causal, sl2);
        else if (which == FA_FIRST) fa_dq_tile<D, 0, 1>(dq, qa, da, lse_r, dd_r, kt, vt, q0, k0, qi0, cq, t, causal, sl2);
        else fa_dq_tile<D, MT - 1, 1>(dq, qa, da, lse_r, dd_r, kt, vt, q0, k0, qi0, cq, t, causal, sl2);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MT; i++)
        fa_store<D>(dqkv, dqkv16, (u64)b * t * w, w, h * D, q0 + i * FA_TILE + warp * 16, t, dq[i], scale, scale, rope_tab);
}

// Blocks of the forward per SM the registers are capped for: 2 up to D = 64 (two query tiles fit in
// 255 registers without spilling; with one tile it was capped at 4 blocks), the compiler's choice
// above.
#ifndef FA_FWD_MIN_BLOCKS
#define FA_FWD_MIN_BLOCKS(D) ((D) <= 64 ? 2 : 1)
#endif
// Blocks of dK/dV per SM the registers are capped for: 3 up to D = 64 (its 32-query halves fit
// in 168 registers with 4 bytes spilled; at 2 blocks the SM holds 8 warps, too few to hide the
// latencies of one chain of MMAs each), the compiler's choice above.
#ifndef FA_DKDV_MIN_BLOCKS
#define FA_DKDV_MIN_BLOCKS(D) ((D) <= 64 ? 3 : 1)
#endif
#ifndef FA_DQ_MIN_BLOCKS
#define FA_DQ_MIN_BLOCKS(D) 1
#endif

#define FA_ENTRY(D)                                                                                                    \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, FA_FWD_MIN_BLOCKS(D))                                     \
        flash_fwd_d##D(void* out, int out16, float* lse, FaTensor q, FaTensor k, FaTensor v, int t, int nh, int kvh,  \
                       float scale, int causal) {                                                                      \
        flash_fwd<D>(out, out16, lse, q, k, v, t, nh, kvh, scale, causal);                                             \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, FA_DKDV_MIN_BLOCKS(D))                                    \
        flash_bwd_dkdv_d##D(void* dqkv, int dqkv16, FaTensor q, FaTensor k, FaTensor v, FaTensor dy,                   \
                            const float* lse, const float* delta, int t, int nh, int kvh, float scale, int causal,     \
                            const float* rope_tab) {                                                                   \
        flash_bwd_dkdv<D>(dqkv, dqkv16, q, k, v, dy, lse, delta, t, nh, kvh, scale, causal, rope_tab);                 \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, FA_DQ_MIN_BLOCKS(D))                                      \
        flash_bwd_dq_d##D(void* dqkv, int dqkv16, FaTensor q, FaTensor k, FaTensor v, FaTensor dy,                     \
                          const float* lse, const float* delta, int t, int nh, int kvh, float scale, int causal,       \
                          const float* rope_tab) {                                                                     \
        flash_bwd_dq<D>(dqkv, dqkv16, q, k, v, dy, lse, delta, t, nh, kvh, scale, causal, rope_tab);                   \
    }

FA_ENTRY(16)
FA_ENTRY(32)
FA_ENTRY(64)
FA_ENTRY(96)
FA_ENTRY(128)
