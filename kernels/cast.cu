// GEMM operand casts and their statistics. A linear layer's operand (rows x cols, f32, row-major) is
// cast to BF16 or FP8 (x * scale, round to nearest even, saturate: cvt.rn.satfinite), optionally
// transposed on the way (cuBLASLt's FP8 GEMMs take only the TN layout, so dgrad needs W^T and
// wgrad dY^T and X^T), and the statistics the recorder needs are reduced in the same pass:
// amax, the counts (underflow, saturated, NaN, Inf, zeros), moments, and the quantization error.
//
// The cast_src_* kernels cast an operand that was never written: they compute each value from the
// saved inputs of the layer that would have written it (CastSrc: the activation function of fc1's
// output, or its backward), with that layer's element math (activations.cuh).
//
// Statistics are deterministic: each block writes its partials (STAT_FIELDS doubles, field-major),
// and one block reduces them in a fixed order (no floating-point atomics, reduce_partials). For the
// amax pass of current scaling, whose scale the cast after it reads, that block is the cast's last
// block to finish, and it turns the amax into the scale. Every other cast leaves its partials in
// the step's arena, and cast_stats_reduce reduces every recorded cast's of the step in one launch
// (a table of jobs), in the same order, so that no cast waits on its last block
// (capture/src/backend/cuda/stat_batch.rs).
//
// Each cast writes its scale slot (common.cuh: the layout), which the GEMM and its non-finite
// count (gemm_output.cu) read.
//
// Stat fields, in order (keep in step with backend/cuda/mod.rs: Stat):
//  0 finite count, 1 sum, 2 sum of squares, 3 min, 4 max, 5 amax, 6 min |x| over non-zeros,
//  7 underflow, 8 saturated, 9 NaN, 10 Inf, 11 zeros, 12 sum (dq-x)^2, 13 sum dq*x, 14 sum dq^2,
//  15 sum x^2, 16 pairs counted for the error.
#include "common.cuh"
#include "activations.cuh"
#include "norms.cuh"

#define STAT_FIELDS 17
#define CAST_THREADS 256
// Transposed casts go through 64 x 64 tiles in shared memory; each of the CAST_THREADS (256) threads
// moves 16 elements a tile: 4 columns in each of 4 rows, 16 threads across a row (cast_transposed).
#define TILE 64
// Straight casts: each thread loads UNROLL float4s per iteration (16 values in flight).
#define UNROLL 4
// Blocks of a cast kernel resident on one SM, by statistics level: the registers are capped so
// that this many fit (more blocks keep more loads in flight; the full level's doubles need room).
// capture/src/backend/cuda/cast.rs: cast_blocks_per_sm mirrors it.
#define CAST_MIN_BLOCKS(L) ((L) == 0 ? 4 : (L) == 1 ? 3 : 2)

// Per-thread statistics. Counts are integers (exact, cheap); sums are doubles.
struct Acc {
    u32 cnt, under, sat, nan_, inf_, zeros, np;
    float mn, mx, amax, minabs;
    double sum, sumsq, d2, dot, a2, b2;
};

__device__ __forceinline__ void acc_init(Acc& a) {
    a.cnt = a.under = a.sat = a.nan_ = a.inf_ = a.zeros = a.np = 0;
    a.sum = a.sumsq = a.d2 = a.dot = a.a2 = a.b2 = 0.0;
    a.mn = INFINITY; a.mx = -INFINITY; a.amax = 0.0f; a.minabs = INFINITY;
}

// A cast's blocks as its code sees them: its index among them and their count. A kernel of one cast
// takes the launch's own (launch_grid); the weights' multi-tensor cast (cast_weights_*) gives each
// of its casts the blocks a launch of that cast alone would have had, numbered from 0, so that
// every block does the same work and the results are that launch's bit for bit.
struct Grid {
    unsigned bid, nb;
};
__device__ __forceinline__ Grid launch_grid() { return Grid{blockIdx.x, gridDim.x}; }

// Field f of the statistics combines by min (3, 6), max (4, 5) or sum (the rest).
__device__ __forceinline__ double stat_comb(int f, double a, double b) {
    return (f == 3 || f == 6) ? fmin(a, b) : ((f == 4 || f == 5) ? fmax(a, b) : a + b);
}
__device__ __forceinline__ double stat_ident(int f) {
    return (f == 3 || f == 6) ? (double)INFINITY : (f == 4 ? -(double)INFINITY : 0.0);
}
// Whether statistics level L computes field f: 0 amax and counts, 1 plus moments, 2 plus the
// quantisation error. Fields a level skips keep their identity value in the record.
__device__ __forceinline__ constexpr bool stat_needed(int f, int L) {
    return L >= 2 || f == 5 || (f >= 7 && f <= 11) || (L >= 1 && f <= 6);
}

// Block-wide reduction of the needed fields (warp trees, then the warps in index order), in a fixed
// order with a single barrier round: res[f] holds field f after.
template <int L>
__device__ __forceinline__ void block_reduce_stats(double v[STAT_FIELDS], double* sh, double* res) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int f = 0; f < STAT_FIELDS; f++) {
        if (!stat_needed(f, L)) continue;
        for (int o = 16; o > 0; o >>= 1) v[f] = stat_comb(f, v[f], __shfl_xor_sync(0xffffffffu, v[f], o));
    }
    if (lane == 0) {
#pragma unroll
        for (int f = 0; f < STAT_FIELDS; f++) if (stat_needed(f, L)) sh[f * 32 + warp] = v[f];
    }
    __syncthreads();
    if (threadIdx.x < STAT_FIELDS) {
        int f = threadIdx.x;
        double r = stat_ident(f);
        if (stat_needed(f, L)) for (int w = 0; w < nw; w++) r = stat_comb(f, r, sh[f * 32 + w]);
        res[f] = r;
    }
    __syncthreads();
}

// One block reduces the partials of G blocks (field-major: partials[field * G + block]) into
// res[STAT_FIELDS], in a fixed order: each thread folds blocks threadIdx.x, + blockDim.x, ...,
// then block_reduce_stats. Fields level L skips keep their identity value. stats_commit's last
// block and cast_stats_reduce both call it with CAST_THREADS threads: the same bits either way.
template <int L>
__device__ __forceinline__ void reduce_partials(const double* partials, u64 G, double* sh, double* res) {
    double v[STAT_FIELDS];
#pragma unroll
    for (int f = 0; f < STAT_FIELDS; f++) v[f] = stat_ident(f);
    for (u64 b = threadIdx.x; b < G; b += blockDim.x) {
#pragma unroll
        for (int f = 0; f < STAT_FIELDS; f++) if (stat_needed(f, L)) v[f] = stat_comb(f, v[f], __ldcg(partials + f * G + b));
    }
    block_reduce_stats<L>(v, sh, res);
}

// Writes one block's statistics, field-major: partials[field * g.nb + g.bid] (nothing
// when partials is null: a cast nobody records). With counter null that is all: the partials wait
// for cast_stats_reduce. Otherwise the last block to arrive reduces all g.nb partials into
// record[STAT_FIELDS] (if not null); with scale_mode 1 it also writes the current scale slot[0] =
// scale_for_amax(fmt, amax, margin) * mult and slot[SLOT_INV] = 1/slot[0]. *counter must be 0
// before the launch and is 0 again after it.
template <int L>
__device__ void stats_commit(Acc& a, double* partials, double* __restrict__ record, u32* __restrict__ counter,
                             int scale_mode, int fmt, int margin, float mult, float* __restrict__ slot, Grid g) {
    __shared__ double sh[STAT_FIELDS * 32];
    __shared__ double res[STAT_FIELDS];
    __shared__ bool last;
    // From the cheap level on, plain values reach the amax through the min and max (plain_stats).
    if (L >= 1) a.amax = fmaxf(a.amax, fmaxf(-a.mn, a.mx));
    if (slot != nullptr) {
        // The RISKY flag: a warp vote, one atomic a warp that saw a non-finite or huge value.
        bool risky = (a.nan_ | a.inf_) != 0 || a.amax > RISKY_ABS;
        if (__any_sync(0xffffffffu, risky) && (threadIdx.x & 31) == 0) atomicOr((u32*)(slot + SLOT_RISKY), 1u);
    }
    if (partials == nullptr) return;
    u64 G = g.nb;
    double v[STAT_FIELDS] = {(double)a.cnt, a.sum, a.sumsq, (double)a.mn, (double)a.mx, (double)a.amax, (double)a.minabs,
                             (double)a.under, (double)a.sat, (double)a.nan_, (double)a.inf_, (double)a.zeros,
                             a.d2, a.dot, a.a2, a.b2, (double)a.np};
    block_reduce_stats<L>(v, sh, res);
    if (threadIdx.x < STAT_FIELDS && stat_needed(threadIdx.x, L)) partials[threadIdx.x * G + g.bid] = res[threadIdx.x];
    if (counter == nullptr) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == g.nb - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    reduce_partials<L>(partials, G, sh, res);
    if (threadIdx.x < STAT_FIELDS && record != nullptr) record[threadIdx.x] = res[threadIdx.x];
    if (threadIdx.x == 0) {
        if (scale_mode == 1) {
            float base = scale_for_amax(fmt, (float)res[5], margin);
            slot[0] = base * mult;
            slot[SLOT_BASE] = base;
            slot[SLOT_INV] = 1.0f / base;
        }
        *counter = 0;
    }
}

// Casts one element and folds it into the statistics. Returns the output code (BF16 bits or FP8 byte).
// s: the cast scale; base: the dequantisation scale. With overflow_nan (`--overflow nan`), scaled
// values at or past the rounding limit become NaN (E4M3) or ±Inf (E5M2) instead of saturating, and
// count as NaN / Inf rather than saturated, as the CPU's cast does.
// With sumsq false the sum of squares is left out: a tiled cast that sums the per-channel squares
// takes it from them (cast_transposed), one f64 operation less a value.
template <int FMT, int L>
__device__ __forceinline__ unsigned short cast_one(float v, float s, float base, int overflow_nan, Acc& a, bool sumsq = true) {
    unsigned short code;
    bool under, sat;
    float dq = 0.0f;
    if (FMT == FMT_BF16) {
        __nv_bfloat16 b = __float2bfloat16_rn(v);
        code = *reinterpret_cast<unsigned short*>(&b);
        float r = __bfloat162float(b);
        if (L >= 2) dq = r;
        under = r == 0.0f;
        sat = isinf(r);
    } else {
        float y = v * s;
        u8 q = to_fp8(y, FMT);
        sat = fabsf(y) > fmt_max(FMT);
        bool ovf = overflow_nan && isfinite(y) && fabsf(y) >= (FMT == FMT_E4M3 ? 464.0f : 61440.0f);
        q = ovf ? (u8)((FMT == FMT_E4M3 ? 0x7F : 0x7C) | (y < 0.0f ? 0x80 : 0)) : q;
        sat = sat && !ovf;
        if (FMT == FMT_E4M3) a.nan_ += ovf; else a.inf_ += ovf;
        code = q;
        if (L >= 2) dq = from_fp8(q, FMT) / base;
        under = (q & 0x7f) == 0;
    }
    // FP8: saturated counts every non-NaN input whose scaled value passes max (Inf included), as
    // crate::fp8::quantize does; BF16: finite inputs that round to Inf.
    // Branch-free: selects and predicated adds, so that a warp never diverges per element (the
    // statistics of a non-finite input are the identities: 0 to sums, ±inf to min / max).
    if (FMT != FMT_BF16) a.sat += sat;
    bool vnan = isnan(v), vinf = isinf(v), fin = !(vnan || vinf), nz = fin && v != 0.0f;
    a.nan_ += vnan;
    a.inf_ += vinf;
    float av = fabsf(v);
    a.amax = fmaxf(a.amax, fin ? av : 0.0f);
    a.zeros += fin && !nz;
    a.under += nz && under;
    if (FMT == FMT_BF16) a.sat += nz && sat;
    if (L >= 1) {
        double dv = (double)(fin ? v : 0.0f);
        a.cnt += fin;
        a.sum += dv;
        if (sumsq) a.sumsq = fma(dv, dv, a.sumsq);
        a.mn = fminf(a.mn, fin ? v : INFINITY);
        a.mx = fmaxf(a.mx, fin ? v : -INFINITY);
        a.minabs = fminf(a.minabs, nz ? av : INFINITY);
    }
    if (L >= 2 && fin && isfinite(dq)) {
        double d = (double)dq - (double)v;
        a.d2 += d * d;
        a.dot += (double)dq * (double)v;
        a.a2 += (double)dq * (double)dq;
        a.b2 += (double)v * (double)v;
        a.np++;
    }
    return code;
}

// The arguments every cast kernel takes (see cast_fwd_* below).
#define CAST_PARAMS                                                                                        \
    const float* __restrict__ x, int rows, int cols, float scale_arg, int scale_mode, float* __restrict__ slot, \
        void* __restrict__ out, void* __restrict__ out_t, double* partials, double* __restrict__ record, u32* __restrict__ counter,     \
        int margin, float mult, int overflow_nan, u64 o0, u64 o1, u64 o2, u64 o3, float outlier_factor,         \
        double* __restrict__ ch_sq, float* __restrict__ ch_amax, double* __restrict__ ch_sum

// The cast and dequantisation scales of a launch; block 0 publishes them to the slot (scale_mode 0).
template <int FMT>
__device__ __forceinline__ void cast_scales(float scale_arg, int scale_mode, float mult, float* slot, float& s, float& base, Grid g) {
    s = 1.0f;
    base = 1.0f;
    if (FMT != FMT_BF16) {
        if (scale_mode == 1) { s = slot[0]; base = slot[SLOT_BASE]; }
        else { base = scale_arg; s = base * mult; }
    }
    if (scale_mode == 0 && g.bid == 0 && threadIdx.x == 0 && slot != nullptr) {
        slot[0] = s;
        slot[SLOT_BASE] = base;
        slot[SLOT_INV] = 1.0f / base;
    }
}

__device__ __forceinline__ float planted(float v, u64 i, u64 o0, u64 o1, u64 o2, u64 o3, float f) {
    return (f != 1.0f && (i == o0 || i == o1 || i == o2 || i == o3)) ? v * f : v;
}

// out = cast(x), same layout: a flat, vectorised pass (float4 loads; 4 codes stored at once).
template <int FMT, int L>
__device__ void cast_straight(CAST_PARAMS) {
    float s, base;
    cast_scales<FMT>(scale_arg, scale_mode, mult, slot, s, base, launch_grid());
    Acc a;
    acc_init(a);
    u64 n = (u64)rows * cols, n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    u64 stride = (u64)gridDim.x * CAST_THREADS * UNROLL;
    for (u64 i0 = (u64)blockIdx.x * CAST_THREADS * UNROLL + threadIdx.x; i0 < n4; i0 += stride) {
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            u64 i = i0 + (u64)u * CAST_THREADS;
            if (i < n4) v[u] = __ldg(x4 + i);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            u64 i = i0 + (u64)u * CAST_THREADS;
            if (i >= n4) break;
            u64 e = 4 * i;
            unsigned short c0 = cast_one<FMT, L>(planted(v[u].x, e, o0, o1, o2, o3, outlier_factor), s, base, overflow_nan, a);
            unsigned short c1 = cast_one<FMT, L>(planted(v[u].y, e + 1, o0, o1, o2, o3, outlier_factor), s, base, overflow_nan, a);
            unsigned short c2 = cast_one<FMT, L>(planted(v[u].z, e + 2, o0, o1, o2, o3, outlier_factor), s, base, overflow_nan, a);
            unsigned short c3 = cast_one<FMT, L>(planted(v[u].w, e + 3, o0, o1, o2, o3, outlier_factor), s, base, overflow_nan, a);
            if (out != nullptr) {
                if (FMT == FMT_BF16) {
                    ((uint2*)out)[i] = make_uint2((u32)c0 | ((u32)c1 << 16), (u32)c2 | ((u32)c3 << 16));
                } else {
                    ((u32*)out)[i] = (u32)c0 | ((u32)c1 << 8) | ((u32)c2 << 16) | ((u32)c3 << 24);
                }
            }
        }
    }
    // The n % 4 tail, by the last block.
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x < n - 4 * n4) {
        u64 e = 4 * n4 + threadIdx.x;
        unsigned short c = cast_one<FMT, L>(planted(x[e], e, o0, o1, o2, o3, outlier_factor), s, base, overflow_nan, a);
        if (out != nullptr) {
            if (FMT == FMT_BF16) ((unsigned short*)out)[e] = c; else ((u8*)out)[e] = (u8)c;
        }
    }
    stats_commit<L>(a, partials, record, counter, scale_mode == 2 ? 1 : 0, FMT, margin, mult, slot, launch_grid());
}

// Loads the 4 x 4 values thread (tx, ty) casts in the tile at (r0, c0): rows r0 + ty + 16 j (j < 4),
// columns c0 + 4 tx .. + 3, as 16-byte loads where the row allows; 0 past the edges.
__device__ __forceinline__ void load_tile(const float* __restrict__ x, int rows, int cols, int r0, int c0, int tx, int ty,
                                          bool vec_in, float (&v)[4][4]) {
    int c = c0 + 4 * tx;
    bool full4 = vec_in && c + 3 < cols;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int r = r0 + ty + 16 * j;
        if (r < rows && full4) {
            float4 f = __ldg(reinterpret_cast<const float4*>(x + (u64)r * cols + c));
            v[j][0] = f.x; v[j][1] = f.y; v[j][2] = f.z; v[j][3] = f.w;
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) v[j][k] = (r < rows && c + k < cols) ? __ldg(x + (u64)r * cols + c + k) : 0.0f;
        }
    }
}

// Values a cast computes as it reads them (the cast_src_* kernels) instead of reading x, from the
// saved inputs of the layer that would otherwise have written x first; the element math is
// activations.cuh's (and norms.cuh's), so the values, and the codes, are those of the unfused pair
// of kernels. For the activation kinds (1 to 5), h and b hold BF16 values (the GEMM outputs they are), and every row of them and of x has a multiple of
// 4 values, 8-byte aligned (capture/src/backend/cuda/cast.rs checks both). The kind is a template
// parameter of the kernels (cast_src{K}_*), so each is compiled with its own inputs only.
#define SRC_SWIGLU 1   // x (rows, F) = swiglu(h), h = fc1's output (rows, 2F)
#define SRC_DSWIGLU 2  // x (rows, 2F) = [d(gate) | d(up)] from h (rows, 2F) and b = dout (rows, F)
#define SRC_GELU 3     // x = gelu(h), h (rows, cols)
#define SRC_DGELU 4    // x = gelu'(h) * b, h and b (rows, cols)
// SRC_DSWIGLU by pairs of tiles, for F a multiple of TILE: the tile at gate columns c0.. and the
// one at up columns F + c0.. come from one read of gate, up and dout and one evaluation of the
// backward (SRC_DSWIGLU reads and evaluates them once for each half).
#define SRC_DSWIGLU_PAIRS 5
// A normalization's output, computed from its input x (the kernel's x, f32) with norms.cuh's math:
// each row's saved statistics (rstd, and the mean for LayerNorm) and each column's gain (and bias),
// f32. The normalization's own kernel then writes only the row statistics (rmsnorm.cu,
// layernorm.cu with out null), and the normalized tensor is neither written nor read.
#define SRC_RMSNORM 6    // x (rows, cols) = rmsnorm(x): rstd, gain
#define SRC_LAYERNORM 7  // x (rows, cols) = layernorm(x): mean, rstd, gain, shift (the bias)
// A tensor held in 16 bits (a BF16 buffer: the attention's output, GPT's dqkv): x = h, each value
// widened to f32 exactly, so the codes and statistics are a plain cast's of the f32 copy.
#define SRC_BF16 8       // x (rows, cols) = h (rows, cols)
struct CastSrc {
    const unsigned short* h;
    const unsigned short* b;
    const float* gain;
    const float* shift;
    const float* rstd;
    const float* mean;
};

// Whether kind K normalizes x as it is read (its values are x's, loaded as a plain cast's).
template <int K> struct SrcNorm {
    static constexpr bool V = K == SRC_RMSNORM || K == SRC_LAYERNORM;
};

// The normalized values of the thread's 4 x 4 share of the tile at (r0, c0), in place of x's: its
// rows' statistics (rstd, and mean) and its columns' gain (and shift) are loaded here, at the cast
// (after the next tile's loads are issued), not a tile ahead with x's values (holding them spilled
// registers in the cheap level's casts).
// They are a few words a tile, shared by the block's threads (and a run's tiles share the columns'),
// so they come from the caches. Past the edges they are zero (those values are not cast).
template <int K>
__device__ __forceinline__ void norm_apply(const CastSrc& s, int rows, int cols, int r0, int c0, int tx, int ty, float (&v)[4][4]) {
    int c = c0 + 4 * tx;
    float rs[4], mu[4], g[4], sh[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int r = r0 + ty + 16 * j;
        rs[j] = r < rows ? __ldg(s.rstd + r) : 0.0f;
        mu[j] = K == SRC_LAYERNORM && r < rows ? __ldg(s.mean + r) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        g[k] = c + k < cols ? __ldg(s.gain + c + k) : 0.0f;
        sh[k] = K == SRC_LAYERNORM && c + k < cols ? __ldg(s.shift + c + k) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[j][k] = K == SRC_RMSNORM ? rmsnorm_one(v[j][k], rs[j], g[k]) : layernorm_one(v[j][k], mu[j], rs[j], g[k], sh[k]);
}

// The inputs (BF16) kind K reads for each value: gate and up (SwiGLU), h (GELU), and dout for
// the backwards.
template <int K> struct SrcInputs {
    static constexpr int N = K == 0 || K == SRC_GELU || K == SRC_BF16 ? 1 : K == SRC_SWIGLU || K == SRC_DGELU ? 2 : 3;
};

// A thread's raw inputs for its 4 x 4 values of a tile (load_tile's rows and columns): per row, 4
// BF16 values of each input, packed two to a word. The next tile's are loaded while this one is
// cast, as load_tile's values are, for the kinds of one or two inputs (cast_transposed: AHEAD);
// the element math runs at the cast (src_compute).
template <int K> struct SrcRaw {
    uint2 in[4][SrcInputs<K>::N];
};

__device__ __forceinline__ uint2 ld_bf16x4(const unsigned short* p, u64 i) {
    return __ldg(reinterpret_cast<const uint2*>(p + i));
}

// Loads the raw inputs of the tile at (r0, c0) (zeros past the edges, which compute to 0). For
// SRC_DSWIGLU_PAIRS, c0 is a gate column and the tile's pair is read with it.
template <int K>
__device__ __forceinline__ void src_load_raw(const CastSrc& s, int rows, int cols, int r0, int c0, int tx, int ty, SrcRaw<K>& raw) {
    int c = c0 + 4 * tx;
    bool swiglu_bwd = K == SRC_DSWIGLU || K == SRC_DSWIGLU_PAIRS;
    int f = swiglu_bwd ? cols / 2 : cols;  // SwiGLU: the width of a half of h
    bool up = K == SRC_DSWIGLU && c >= f;  // the d(up) half: no up value needed
    int j = up ? c - f : c;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        int r = r0 + ty + 16 * q;
#pragma unroll
        for (int i = 0; i < SrcInputs<K>::N; i++) raw.in[q][i] = make_uint2(0u, 0u);
        if (r >= rows || c >= cols) continue;
        if (K == SRC_SWIGLU || swiglu_bwd) {
            u64 hb = (u64)r * 2 * f;
            raw.in[q][0] = ld_bf16x4(s.h, hb + j);
            if (!up) raw.in[q][1] = ld_bf16x4(s.h, hb + f + j);
            if (swiglu_bwd) raw.in[q][2] = ld_bf16x4(s.b, (u64)r * f + j);
        } else {
            raw.in[q][0] = ld_bf16x4(s.h, (u64)r * cols + c);
            if (K == SRC_DGELU) raw.in[q][1] = ld_bf16x4(s.b, (u64)r * cols + c);
        }
    }
}

// The values of the thread's 4 x 4 share of the tile at column c0 from its raw inputs; for
// SRC_DSWIGLU_PAIRS, v gets the gate tile's (d(gate)) and w its pair's (d(up)).
template <int K>
__device__ __forceinline__ void src_compute(int cols, int c0, int tx, const SrcRaw<K>& raw, float (&v)[4][4], float (&w)[4][4]) {
    bool up = K == SRC_DSWIGLU && c0 + 4 * tx >= cols / 2;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float a[4], u[4], d[4];
        unpack_bf16x4(raw.in[q][0], a);
        if (K == SRC_SWIGLU || SrcInputs<K>::N == 3) unpack_bf16x4(raw.in[q][1], u);
        if (K == SRC_DGELU) unpack_bf16x4(raw.in[q][1], d);
        if (SrcInputs<K>::N == 3) unpack_bf16x4(raw.in[q][2], d);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (K == SRC_SWIGLU) {
                v[q][k] = swiglu_one(a[k], u[k]);
            } else if (K == SRC_DSWIGLU || K == SRC_DSWIGLU_PAIRS) {
                float dg, du;
                dswiglu_one(a[k], u[k], d[k], dg, du);
                v[q][k] = K == SRC_DSWIGLU && up ? du : dg;
                if (K == SRC_DSWIGLU_PAIRS) w[q][k] = du;
            } else if (K == SRC_GELU) {
                v[q][k] = gelu_one(a[k]);
            } else if (K == SRC_BF16) {
                v[q][k] = a[k];
            } else {
                v[q][k] = dgelu_one(a[k], d[k]);
            }
        }
    }
}

// The BF16 code of v (round to nearest even), as cast_one gives it, without statistics. (FP8 rows
// take fp8x4.)
__device__ __forceinline__ unsigned short bf16_code(float v) {
    __nv_bfloat16 b = __float2bfloat16_rn(v);
    return *reinterpret_cast<unsigned short*>(&b);
}

// Folds one value into its column's channel partials (the thread's share of a tile): its square
// (f64) and |x|, for finite values only.
__device__ __forceinline__ void channel_add(float pv, double& sq, float& am) {
    bool fin = isfinite(pv);
    double dv = (double)(fin ? pv : 0.0f);
    sq = fma(dv, dv, sq);
    am = fmaxf(am, fin ? fabsf(pv) : -INFINITY);
}

// Whether a value's BF16 code is plain: neither zero (a zero or an underflow) nor Inf / NaN (an
// overflow or a non-finite value). A plain value adds to no count of cast_one's, only to the amax
// and the moments. (FP8 rows take fp8x4_plain.)
__device__ __forceinline__ bool bf16_plain(unsigned short code) {
    float r = __uint_as_float((u32)code << 16);
    return (fabsf(r) > 0.0f) & (fabsf(r) < INFINITY);
}

// cast_one's statistics of a plain value (bf16_plain, fp8x4_plain): the same operations in the same order, so
// the results are bit-identical to cast_one's.
// From the cheap level on, the amax is not folded here: stats_commit takes it from the min and
// max (max |x| over finite values = max(-min, max), exactly), one instruction less per value; and
// the caller counts its plain values (4 at once).
template <int L>
__device__ __forceinline__ void plain_stats(float v, Acc& a, bool sumsq = true) {
    float av = fabsf(v);
    if (L == 0) a.amax = fmaxf(a.amax, av);
    if (L >= 1) {
        double dv = (double)v;
        a.sum += dv;
        if (sumsq) a.sumsq = fma(dv, dv, a.sumsq);
        a.mn = fminf(a.mn, v);
        a.mx = fmaxf(a.mx, v);
        a.minabs = fminf(a.minabs, av);
    }
}

// The statistics of a row of 4 plain values (bf16_plain, fp8x4_plain): their count and plain_stats, and with
// channels each one's square and |x| folded into its column's sq / am (and not into the sum of
// squares, which cast_transposed then takes from sq).
template <int L>
__device__ __forceinline__ void plain_row(const float (&vr)[4], bool channels, Acc& a, double (&sq)[4], float (&am)[4]) {
    if (L >= 1) a.cnt += 4;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        plain_stats<L>(vr[k], a, !channels);
        if (channels) {
            double dv = (double)vr[k];
            sq[k] = fma(dv, dv, sq[k]);
            am[k] = fmaxf(am[k], fabsf(vr[k]));
        }
    }
}

// The shared tile of cast_transposed's codes: BF16 codes as u16 (rows padded by one word), FP8
// codes as bytes, rows of TILE + 4 so that a thread's 4 codes of a row are one aligned u32 (the
// tile itself is declared ALIGN-byte aligned: a byte array alone is not). A BF16 row is 33 words,
// so that in a word-aligned tile two adjacent codes of a row are one aligned word too
// (tile_column_sums reads them so).
template <int FMT> struct CodeTile {
    typedef unsigned short T;
    static constexpr int W = TILE + 2, ALIGN = 2;
};
template <> struct CodeTile<FMT_E4M3> {
    typedef u8 T;
    static constexpr int W = TILE + 4, ALIGN = 4;
};
template <> struct CodeTile<FMT_E5M2> {
    typedef u8 T;
    static constexpr int W = TILE + 4, ALIGN = 4;
};

// Four values scaled by s and cast to FP8 (cvt.rn.satfinite, two at a time), packed into a word in
// order (y[0] in the low byte): the codes to_fp8 gives one at a time. y[] gets the scaled values.
template <int FMT>
__device__ __forceinline__ u32 fp8x4(const float (&v)[4], float s, float (&y)[4]) {
#pragma unroll
    for (int k = 0; k < 4; k++) y[k] = v[k] * s;
    __nv_fp8_interpretation_t t = FMT == FMT_E4M3 ? __NV_E4M3 : __NV_E5M2;
    u32 lo = __nv_cvt_float2_to_fp8x2(make_float2(y[0], y[1]), __NV_SATFINITE, t);
    u32 hi = __nv_cvt_float2_to_fp8x2(make_float2(y[2], y[3]), __NV_SATFINITE, t);
    return lo | (hi << 16);
}

// Whether all four FP8 codes packed in w are plain, with y their scaled values. A plain value is
// finite and not zero, and its code is neither zero (underflow) nor saturated: each byte's low 7
// bits non-zero (adding 0x7f to a byte of 0..0x7f sets its top bit unless it is 0, and never
// carries), and every |y| within the format's max (false for NaN).
template <int FMT>
__device__ __forceinline__ bool fp8x4_plain(u32 w, const float (&y)[4]) {
    bool nonzero = ((((w & 0x7f7f7f7fu) + 0x7f7f7f7fu) & 0x80808080u) == 0x80808080u);
    float m = fmt_max(FMT);
    return nonzero & (fabsf(y[0]) <= m) & (fabsf(y[1]) <= m) & (fabsf(y[2]) <= m) & (fabsf(y[3]) <= m);
}

// A 4 x 4 block of bytes transposed: r[i] holds row i's 4 bytes (byte k in bits 8k..), c[k] gets
// column k's (row i's in bits 8i..). Eight byte permutes (PRMT).
__device__ __forceinline__ void fp8_transpose4(const u32 (&r)[4], u32 (&c)[4]) {
    u32 lo01 = __byte_perm(r[0], r[1], 0x5140), hi01 = __byte_perm(r[0], r[1], 0x7362);
    u32 lo23 = __byte_perm(r[2], r[3], 0x5140), hi23 = __byte_perm(r[2], r[3], 0x7362);
    c[0] = __byte_perm(lo01, lo23, 0x5410);
    c[1] = __byte_perm(lo01, lo23, 0x7632);
    c[2] = __byte_perm(hi01, hi23, 0x5410);
    c[3] = __byte_perm(hi01, hi23, 0x7632);
}

// One thread's share of a tile of cast_transposed: its 16 values (rows r0 + ty + 16 j, columns
// c .. c + 3) cast into the shared tile and, with out set, into out in x's layout, 4 codes at
// once; with channels, their squares and |x| folded into sq / am per column. Elements past the
// tensor's edge get code 0 and no statistics; planted outliers are applied only when there are
// some (the index arithmetic stays out of the common path). A row of 4 inside the tensor is cast
// first and, when all 4 are plain (bf16_plain, fp8x4_plain: the common case), only their amax and moments are
// folded in; otherwise cast_one counts each (zeros, underflow, saturation, NaN, Inf). For FP8 the
// row is cast two values at a time, tested four at once and stored as one word (fp8x4,
// fp8x4_plain): the SASS of the element-wise path spent most of its instructions moving bytes,
// and the cheap level's casts are bound by their instructions, not by memory latency
// (bench/results/2026-12-01-cast-words).
template <int FMT, int L>
__device__ __forceinline__ void cast_tile_part(const float (&v)[4][4], int r0, int c, int rows, int cols, int tx, int ty,
                                               float s, float base, int overflow_nan, u64 o0, u64 o1, u64 o2, u64 o3,
                                               float outlier_factor, bool channels, Acc& a,
                                               typename CodeTile<FMT>::T (&tile)[TILE][CodeTile<FMT>::W], void* __restrict__ out,
                                               double (&sq)[4], float (&am)[4]) {
    bool full4 = (cols & 3) == 0 && c + 3 < cols;
    bool plant = outlier_factor != 1.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int r = r0 + ty + 16 * j;
        unsigned short code[4];
        if (FMT != FMT_BF16 && L <= 1 && !plant && full4 && r < rows) {
            // FP8, a whole row of 4 inside the tensor: cast two at a time, tested four at once,
            // and stored as one word to the tile and to out. A value past the format's max is not
            // plain, so overflow_nan (which changes only such values' codes) is left to cast_one.
            float y[4];
            u32 w = fp8x4<FMT>(v[j], s, y);
            if (fp8x4_plain<FMT>(w, y)) {
                plain_row<L>(v[j], channels, a, sq, am);
            } else {
                w = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    w |= (u32)cast_one<FMT, L>(v[j][k], s, base, overflow_nan, a, !channels) << (8 * k);
                    if (channels) channel_add(v[j][k], sq[k], am[k]);
                }
            }
            *reinterpret_cast<u32*>(&tile[ty + 16 * j][4 * tx]) = w;
            if (out != nullptr) *reinterpret_cast<u32*>((u8*)out + (u64)r * cols + c) = w;
            continue;
        }
        if (FMT == FMT_BF16 && L <= 1 && !plant && full4 && r < rows) {
            bool plain = true;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                code[k] = bf16_code(v[j][k]);
                plain &= bf16_plain(code[k]);  // & (not &&): no branch per value
            }
            if (plain) {
                plain_row<L>(v[j], channels, a, sq, am);
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    cast_one<FMT, L>(v[j][k], s, base, overflow_nan, a, !channels);
                    if (channels) channel_add(v[j][k], sq[k], am[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++) tile[ty + 16 * j][4 * tx + k] = code[k];
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                code[k] = 0;
                if (r < rows && c + k < cols) {
                    float pv = v[j][k];
                    if (plant) pv = planted(pv, (u64)r * cols + c + k, o0, o1, o2, o3, outlier_factor);
                    code[k] = cast_one<FMT, L>(pv, s, base, overflow_nan, a, !channels);
                    if (channels) channel_add(pv, sq[k], am[k]);
                }
                tile[ty + 16 * j][4 * tx + k] = code[k];
            }
        }
        if (out != nullptr && r < rows) {
            u64 i = (u64)r * cols + c;
            if (full4) {
                if (FMT == FMT_BF16) *reinterpret_cast<uint2*>((unsigned short*)out + i) = make_uint2((u32)code[0] | ((u32)code[1] << 16), (u32)code[2] | ((u32)code[3] << 16));
                else *reinterpret_cast<u32*>((u8*)out + i) = (u32)code[0] | ((u32)code[1] << 8) | ((u32)code[2] << 16) | ((u32)code[3] << 24);
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (c + k >= cols) break;
                    if (FMT == FMT_BF16) ((unsigned short*)out)[i + k] = code[k]; else ((u8*)out)[i + k] = (u8)code[k];
                }
            }
        }
    }
}

// The column sums of a tile of BF16 codes (cast_transposed's shared tile, complete): thread t
// adds rows 8 g .. 8 g + 7 (g = t / 32, its warp) of columns 2 p and 2 p + 1 (p = t % 32), read
// as one word a row (a warp reads one row's 32 words: no bank conflict), each value in f64; the
// two sums go into its own entries of csum[g], set at the start of a run (run_start) and added to
// after. A code past the tensor's edge is 0 in the tile and adds nothing.
__device__ __forceinline__ void tile_column_sums(const unsigned short (&tile)[TILE][TILE + 2], bool run_start, double (&csum)[8][TILE]) {
    int p = threadIdx.x & 31, g = threadIdx.x >> 5;
    double s0 = 0.0, s1 = 0.0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        u32 w = *reinterpret_cast<const u32*>(&tile[8 * g + i][2 * p]);
        s0 += (double)__uint_as_float(w << 16);
        s1 += (double)__uint_as_float(w & 0xffff0000u);
    }
    csum[g][2 * p] = run_start ? s0 : csum[g][2 * p] + s0;
    csum[g][2 * p + 1] = run_start ? s1 : csum[g][2 * p + 1] + s1;
}

// out_t = cast(x)^T: (cols, rows), and with out not null also out = cast(x) in x's layout (both
// layouts from one read: the dual cast). 64 x 64 tiles, strided over the blocks. Thread t of the
// block takes rows ty + 16 j (j < 4, ty = t / 16) at columns 4 tx .. 4 tx + 3 (tx = t % 16): 16-byte
// loads along x's rows and 4 codes stored at once; the codes go through shared memory and leave
// along out_t's rows, 4 at once. The next tile's values are loaded before this tile is cast, so
// that a block always has its loads in flight (the kernel is bound by memory latency otherwise).
// With ch_sq set (a recorded cast at the cheap level or above), the block also sums each column's
// x^2 (f64) and max |x| over finite values, and writes them to ch_sq / ch_amax[slot * cols + col]
// at the end of each run of its tiles in one column tile, the slot being the row tile of the
// run's first tile: the per-channel statistics without a second read of x (channel_stats_reduce
// then sums the slots in order). A run is one tile unless the grid is a multiple of tiles_c: then
// each block stays in one column tile, and writes its partials once instead of once a tile
// (cast.rs: cast_grid picks such a grid for a recorded cast).
// With ch_sum set (BF16 only: a gradient dY whose layer takes its bias gradient from this cast),
// the block also sums each column's BF16 codes, the values the GEMMs read, in f64
// (tile_column_sums), and writes them to ch_sum[slot * cols + col] at the end of each run as it
// writes the channel partials: the bias gradient without a second read of dY (the caller reduces
// the slots with colsum_bf16_reduce). Such sums are exact unless their exponents span about 2^29
// (colsum_bf16_partial), so they equal colsum_bf16_partial's, bit for bit.
// SRC (a CastSrc kind, 0 for none) computes the values from src instead of reading x. With
// SRC_DSWIGLU_PAIRS the blocks stride over the tiles of the gate half (cols / 2 wide, a multiple
// of TILE), and cast each one and then its pair in the up half, F columns on, from one read;
// every run is then one tile (the slot its row tile).
template <int FMT, int L, int SRC = 0>
__device__ void cast_transposed(CAST_PARAMS, CastSrc src, Grid g) {
    constexpr bool PAIRS = SRC == SRC_DSWIGLU_PAIRS;
    // The codes' column sums exist for the BF16 casts of a gradient only (a buffer's, or GELU's
    // backward computed); the other kernels compile them out (cast.rs: column_sums_of). Their
    // tile is word-aligned, for tile_column_sums (only theirs: the alignment moves ptxas's
    // register allocation, and the RMSNorm cast's then spills).
    constexpr bool COLSUM = FMT == FMT_BF16 && (SRC == 0 || SRC == SRC_DGELU || SRC == SRC_BF16);
    __shared__ __align__(COLSUM ? 4 : CodeTile<FMT>::ALIGN) typename CodeTile<FMT>::T tile[TILE][CodeTile<FMT>::W];
    // Per-thread channel partials of a tile (16 row groups x 64 columns); rows padded against
    // bank conflicts in the reduction below.
    __shared__ double csq[L >= 1 ? 16 : 1][TILE + 2];
    __shared__ float cam[L >= 1 ? 16 : 1][TILE + 2];
    // SRC_DSWIGLU_PAIRS: each thread's 16 values of the pair tile, kept while the gate tile is cast.
    __shared__ float pair_vals[PAIRS ? 16 : 1][PAIRS ? CAST_THREADS : 1];
    // The BF16 column sums of the run so far, by row group (tile_column_sums).
    __shared__ double csum[COLSUM ? 8 : 1][TILE];
    float s, base;
    cast_scales<FMT>(scale_arg, scale_mode, mult, slot, s, base, g);
    Acc a;
    acc_init(a);
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    int tiles_r = (rows + TILE - 1) / TILE;
    // The column tiles the blocks stride over (those of the gate half for SRC_DSWIGLU_PAIRS).
    int pair_off = PAIRS ? cols / 2 : 0;
    int tiles_c = ((PAIRS ? pair_off : cols) + TILE - 1) / TILE;
    bool vec_in = (cols & 3) == 0, vec_t = (rows & 3) == 0;
    // Channel statistics exist from the cheap level on, for a cast given ch_sq (the host's channels
    // level: cast.rs); the amax level compiles them out.
    bool channels = L >= 1 && ch_sq != nullptr;
    bool colsum = COLSUM && ch_sum != nullptr;
    // Tile (tr, tc): block b takes tiles b, b + G, b + 2G, ... in row-major order (G blocks),
    // stepping by (G / tiles_c, G % tiles_c) without a division per tile.
    int step_r = g.nb / tiles_c, step_c = g.nb % tiles_c;
    int tr = g.bid / tiles_c, tc = g.bid % tiles_c;
    // A run: the block's consecutive tiles in one column tile (all of them when the grid is a
    // multiple of tiles_c, so that step_c is 0; one tile otherwise, and always with pairs). Its
    // channel partials add up in the thread's own entries of csq / cam and leave once, at its
    // end, into the slot of its first tile's row tile (slots: cast.rs, channel_slots). Whether a
    // tile starts a run, and the run's slot, are derived each tile from tr and the block's first
    // row tile (first_tr, the starting tr): a run-start flag and slot carried from tile to tile
    // took two more registers and made the BF16 dual cast spill its next tile.
    bool one_tile_runs = PAIRS || step_c != 0;
    int first_tr = g.bid / tiles_c;
    // Whether a tile's inputs are loaded a tile ahead, while the one before is cast: x's, and the
    // raw inputs of the computed sources of one or two inputs a value. Those of three (SwiGLU's
    // backward) are loaded at their tile: their casts are bound by their instructions (the element
    // math), and holding the next tile's 12 words a thread cost a resident block an SM. Loaded at
    // its tile, the paired cast runs 3 blocks an SM at the cheap level instead of 2, and a
    // llama-1b step's 16 take 6.04 ms instead of 6.51 (bench/results/2026-12-02-paired-cast-occupancy).
    // A normalization kind loads x as a plain cast does (ahead), and normalizes it at the cast
    // (norm_apply).
    constexpr bool NORM = SrcNorm<SRC>::V;
    constexpr bool RAW = SRC != 0 && !NORM;  // values computed from raw BF16 inputs (SrcRaw)
    constexpr bool AHEAD = NORM || SrcInputs<SRC>::N < 3;
    float v[4][4];
    SrcRaw<SRC> raw;
    if (AHEAD && tr < tiles_r) {
        if (RAW) src_load_raw<SRC>(src, rows, cols, tr * TILE, tc * TILE, tx, ty, raw);
        else load_tile(x, rows, cols, tr * TILE, tc * TILE, tx, ty, vec_in, v);
    }
    // Casts the thread's values vv of the tile at (r0, c0), writes out, out_t and the channel
    // partials; nr / nc: the block's next tile (the end of a run).
    auto cast_one_tile = [&](const float (&vv)[4][4], int r0, int c0, int nr, int nc) {
        int c = c0 + 4 * tx;
        double sq[4] = {0.0, 0.0, 0.0, 0.0};
        float am[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        cast_tile_part<FMT, L>(vv, r0, c, rows, cols, tx, ty, s, base, overflow_nan, o0, o1, o2, o3, outlier_factor, channels, a, tile, out, sq, am);
        if (channels) {
            // The tile's sum of squares, from its channel partials (cast_one and plain_row leave
            // it out when they sum those).
            a.sumsq += (sq[0] + sq[1]) + (sq[2] + sq[3]);
            bool run_start = one_tile_runs || tr == first_tr;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                csq[ty][4 * tx + k] = run_start ? sq[k] : csq[ty][4 * tx + k] + sq[k];
                cam[ty][4 * tx + k] = run_start ? am[k] : fmaxf(cam[ty][4 * tx + k], am[k]);
            }
        }
        // The run ends with the block's last tile or where the next tile is in another column tile.
        bool run_end = one_tile_runs || nr >= tiles_r || nc != tc;
        bool flush = channels && run_end;
        __syncthreads();
        if (colsum) {
            tile_column_sums(*reinterpret_cast<unsigned short (*)[TILE][TILE + 2]>(&tile), one_tile_runs || tr == first_tr,
                             *reinterpret_cast<double (*)[8][TILE]>(&csum));
        }
        if (flush) {
            // Each column's 16 row-group partials: 4 threads of one warp take 4 each (lanes
            // l, l + 8, l + 16, l + 24), then two xor-shuffles combine them in a fixed tree.
            int lane = threadIdx.x & 31, part = lane >> 3, col = (threadIdx.x >> 5) * 8 + (lane & 7);
            double cs = 0.0;
            float cm = -INFINITY;
#pragma unroll
            for (int y = 0; y < 4; y++) {
                cs += csq[4 * part + y][col];
                cm = fmaxf(cm, cam[4 * part + y][col]);
            }
            cs += __shfl_xor_sync(0xffffffffu, cs, 8);
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 8));
            cs += __shfl_xor_sync(0xffffffffu, cs, 16);
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
            if (part == 0 && c0 + col < cols) {
                u64 o = (u64)(one_tile_runs ? tr : first_tr) * cols + c0 + col;
                ch_sq[o] = cs;
                ch_amax[o] = cm;
            }
        }
        if (FMT != FMT_BF16 && out_t != nullptr) {
            // FP8: the thread's 4 x 4 block of codes (tile rows 4 tx.., columns 4 ty..) read as 4
            // words and transposed in registers (fp8_transpose4): 4 shared loads instead of 16
            // byte loads and their packing. Each word is a column of x: 4 consecutive codes of
            // an out_t row.
            int orow = r0 + 4 * tx;  // out_t is (cols, rows): 4 of its columns per thread
            u32 rw[4], cw[4];
#pragma unroll
            for (int i = 0; i < 4; i++) rw[i] = *reinterpret_cast<const u32*>(&tile[4 * tx + i][4 * ty]);
            fp8_transpose4(rw, cw);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int oc = c0 + 4 * ty + k;
                if (oc >= cols) break;
                u64 o = (u64)oc * rows + orow;
                if (vec_t && orow + 3 < rows) {
                    *reinterpret_cast<u32*>((u8*)out_t + o) = cw[k];
                } else {
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        if (orow + i >= rows) break;
                        ((u8*)out_t)[o + i] = (u8)(cw[k] >> (8 * i));
                    }
                }
            }
        } else if (out_t != nullptr) {
            int orow = r0 + 4 * tx;  // out_t is (cols, rows): 4 of its columns per thread
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int oc = c0 + ty + 16 * j;
                if (oc >= cols) continue;
                int tcol = ty + 16 * j;
                unsigned short k0 = tile[4 * tx][tcol], k1 = tile[4 * tx + 1][tcol], k2 = tile[4 * tx + 2][tcol], k3 = tile[4 * tx + 3][tcol];
                u64 o = (u64)oc * rows + orow;
                if (vec_t && orow + 3 < rows) {
                    if (FMT == FMT_BF16) *reinterpret_cast<uint2*>((unsigned short*)out_t + o) = make_uint2((u32)k0 | ((u32)k1 << 16), (u32)k2 | ((u32)k3 << 16));
                    else *reinterpret_cast<u32*>((u8*)out_t + o) = (u32)k0 | ((u32)k1 << 8) | ((u32)k2 << 16) | ((u32)k3 << 24);
                } else {
                    unsigned short ks[4] = {k0, k1, k2, k3};
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        if (orow + k >= rows) break;
                        if (FMT == FMT_BF16) ((unsigned short*)out_t)[o + k] = ks[k]; else ((u8*)out_t)[o + k] = (u8)ks[k];
                    }
                }
            }
        }
        __syncthreads();
        if (colsum && run_end && threadIdx.x < TILE && c0 + threadIdx.x < cols) {
            // The run's column sums: a column's 8 row groups in order. The next tile's sums write
            // csum only after its first barrier, which this thread reaches after these reads.
            double t = 0.0;
#pragma unroll
            for (int g = 0; g < 8; g++) t += csum[g][threadIdx.x];
            ch_sum[(u64)(one_tile_runs ? tr : first_tr) * cols + c0 + threadIdx.x] = t;
        }
    };
    while (tr < tiles_r) {
        int r0 = tr * TILE, c0 = tc * TILE;
        int nr = tr + step_r, nc = tc + step_c;
        if (nc >= tiles_c) { nc -= tiles_c; nr++; }
        float nv[4][4];
        SrcRaw<SRC> nraw;
        if (AHEAD && nr < tiles_r) {
            if (RAW) src_load_raw<SRC>(src, rows, cols, nr * TILE, nc * TILE, tx, ty, nraw);
            else load_tile(x, rows, cols, nr * TILE, nc * TILE, tx, ty, vec_in, nv);
        }
        if (NORM) norm_apply<SRC>(src, rows, cols, r0, c0, tx, ty, v);
        if (RAW) {
            // A computed source's values, from its raw inputs (loaded an iteration ago, or now);
            // a pair tile's wait in shared memory, each thread's own.
            if (!AHEAD) src_load_raw<SRC>(src, rows, cols, r0, c0, tx, ty, raw);
            float w[4][4];
            src_compute<SRC>(cols, c0, tx, raw, v, w);
            if (PAIRS) {
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int k = 0; k < 4; k++) pair_vals[4 * j + k][threadIdx.x] = w[j][k];
            }
        }
        cast_one_tile(v, r0, c0, nr, nc);
        if (PAIRS) {
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) v[j][k] = pair_vals[4 * j + k][threadIdx.x];
            cast_one_tile(v, r0, c0 + pair_off, nr, nc);
        }
        if (RAW) {
            if (AHEAD) raw = nraw;
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) v[j][k] = nv[j][k];
        }
        tr = nr;
        tc = nc;
    }
    stats_commit<L>(a, partials, record, counter, scale_mode == 2 ? 1 : 0, FMT, margin, mult, slot, g);
}

#ifndef CAST_SRC_UNIT
// The operand casts, one kernel per (statistics level L, format F, layout T), named
// cast_fwd_l{L}_f{F}_t{T} with F as FMT_* numbers it: T = 0 writes out = cast(x) (x's layout),
// T = 1 out_t = cast(x)^T, T = 2 both (the dual cast: one read for a GEMM's operand and its
// transpose for the next). Statistics are reduced into record[STAT_FIELDS] (stats_commit).
// x: (rows, cols) f32, 16-byte aligned. out: (rows, cols), out_t: (cols, rows), of BF16 (2 bytes)
// or FP8 (1 byte), 8-byte aligned; out may be null with T = 0 (statistics only). Scale:
// scale_mode 0 casts with scale_arg * mult, dequantises with scale_arg, and writes the slot;
// scale_mode 1 reads the slot; scale_mode 2 (the amax pass of current scaling, out null) computes
// the slot from the amax at the end. The four elements at o0..o3 are multiplied by outlier_factor
// first (a planted fault). Level: 0 counts and amax, 1 plus moments, 2 plus quantisation error.
// partials: STAT_FIELDS * gridDim.x doubles (null: no statistics leave the kernel); counter: a
// zeroed u32, or null to leave the partials to cast_stats_reduce (record unused then). ch_sq, ch_amax:
// null, or (with T != 0) the per-channel partials of each run of tiles (cast_transposed).
// Launch: CAST_THREADS threads, any grid (the work is strided over blocks).
#define CAST_KERNEL(L, F, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(CAST_THREADS, CAST_MIN_BLOCKS(L)) cast_fwd_l##L##_f##F##_t##T(CAST_PARAMS) { \
        if (T) cast_transposed<F, L>(x, rows, cols, scale_arg, scale_mode, slot, T == 2 ? out : nullptr, out_t, \
                                     partials, record, counter, margin, mult, overflow_nan, o0, o1, o2, o3,     \
                                     outlier_factor, ch_sq, ch_amax, ch_sum, CastSrc{}, launch_grid());          \
        else cast_straight<F, L>(x, rows, cols, scale_arg, scale_mode, slot, out, nullptr, partials, record,   \
                                 counter, margin, mult, overflow_nan, o0, o1, o2, o3, outlier_factor, nullptr,  \
                                 nullptr, nullptr);                                                              \
    }
#define CAST_KERNELS_F(L, F) CAST_KERNEL(L, F, 0) CAST_KERNEL(L, F, 1) CAST_KERNEL(L, F, 2)
#define CAST_KERNELS_L(L) CAST_KERNELS_F(L, 0) CAST_KERNELS_F(L, 1) CAST_KERNELS_F(L, 2)
CAST_KERNELS_L(0)
CAST_KERNELS_L(1)
CAST_KERNELS_L(2)

// The weights' FP8 casts of a step in one launch (capture/src/backend/cuda/weight_casts.rs): each
// entry of a table in device memory is one weight's dual cast, with a given scale and no fault, as
// cast_fwd_l{L}_f{F}_t2 would cast it: its blocks (CW_BLOCKS, from CW_START on in the launch) are
// the grid that launch would have had, numbered from 0 (Grid), so its codes, its scale slot, its
// statistics partials and its channel partials are that launch's bit for bit. An entry is
// CW_WORDS words: the first block, the blocks, rows in the low and cols in the high half of
// CW_SHAPE, the scale's f32 bits in CW_SCALE, then the addresses of x (f32), out (x's layout),
// out_t (its transpose), the statistics partials (0: none), the channel partials ch_sq and
// ch_amax (0: none) and the scale slot. The partials wait for cast_stats_reduce, as a recorded
// cast's do. Launch: CAST_THREADS threads, the entries' blocks in all.
#define CW_WORDS 12
#define CW_START 0
#define CW_BLOCKS 1
#define CW_SHAPE 2
#define CW_SCALE 3
#define CW_X 4
#define CW_OUT 5
#define CW_OUT_T 6
#define CW_PARTS 7
#define CW_CH_SQ 8
#define CW_CH_AMAX 9
#define CW_SLOT 10
#define CAST_WEIGHTS_KERNEL(L, F)                                                                                        \
    extern "C" __global__ void __launch_bounds__(CAST_THREADS, CAST_MIN_BLOCKS(L)) cast_weights_l##L##_f##F(              \
        const u64* __restrict__ table, int count) {                                                                     \
        const u64* e = mt_entry_of(table, count, blockIdx.x, CW_WORDS);                                                \
        u64 shape = __ldg(e + CW_SHAPE);                                                                                \
        Grid g{blockIdx.x - (unsigned)__ldg(e + CW_START), (unsigned)__ldg(e + CW_BLOCKS)};                             \
        cast_transposed<F, L>(reinterpret_cast<const float*>(__ldg(e + CW_X)), (int)(u32)shape, (int)(shape >> 32),      \
                              __uint_as_float((u32)__ldg(e + CW_SCALE)), 0, reinterpret_cast<float*>(__ldg(e + CW_SLOT)), \
                              reinterpret_cast<void*>(__ldg(e + CW_OUT)), reinterpret_cast<void*>(__ldg(e + CW_OUT_T)),  \
                              reinterpret_cast<double*>(__ldg(e + CW_PARTS)), nullptr, nullptr, 0, 1.0f, 0, ~0ull, ~0ull,  \
                              ~0ull, ~0ull, 1.0f, reinterpret_cast<double*>(__ldg(e + CW_CH_SQ)),                       \
                              reinterpret_cast<float*>(__ldg(e + CW_CH_AMAX)), nullptr, CastSrc{}, g);                 \
    }
#define CAST_WEIGHTS_KERNELS_L(L) CAST_WEIGHTS_KERNEL(L, 1) CAST_WEIGHTS_KERNEL(L, 2)
CAST_WEIGHTS_KERNELS_L(0)
CAST_WEIGHTS_KERNELS_L(1)
CAST_WEIGHTS_KERNELS_L(2)

#endif  // CAST_SRC_UNIT

#ifdef CAST_SRC_UNIT
// The casts of a computed source (CastSrc kind K; x unused but by the normalization kinds, whose
// input it is), statistics level L 0 or 1, format F: the tiled kernel with out (x's layout) and
// out_t (its transpose) each written when not null. cast_src{K}_l{L}_f{F}; the CAST_PARAMS, then
// h and b (BF16) and gain, shift, rstd and mean (f32), each null where the kind reads none. They are a module of their own
// (kernels.rs: Family::CastSrc compiles this file with CAST_SRC_UNIT defined), compiled beside the
// plain casts. Registers are capped for as many blocks per SM as the plain casts' (CAST_MIN_BLOCKS):
// the kinds of three inputs a value fit them because they do not hold the next tile's inputs
// (cast_transposed: AHEAD).
#define CAST_SRC_KERNEL(K, L, F)                                                                             \
    extern "C" __global__ void __launch_bounds__(CAST_THREADS, CAST_MIN_BLOCKS(L)) cast_src##K##_l##L##_f##F( \
        CAST_PARAMS, const unsigned short* __restrict__ src_h, const unsigned short* __restrict__ src_b,          \
        const float* __restrict__ src_gain, const float* __restrict__ src_shift, const float* __restrict__ src_rstd, \
        const float* __restrict__ src_mean) {                                                                    \
        cast_transposed<F, L, K>(x, rows, cols, scale_arg, scale_mode, slot, out, out_t, partials, record, counter,  \
                                 margin, mult, overflow_nan, o0, o1, o2, o3, outlier_factor, ch_sq, ch_amax, ch_sum, \
                                 CastSrc{src_h, src_b, src_gain, src_shift, src_rstd, src_mean}, launch_grid());     \
    }
#define CAST_SRC_KERNELS_L(K, L) CAST_SRC_KERNEL(K, L, 0) CAST_SRC_KERNEL(K, L, 1) CAST_SRC_KERNEL(K, L, 2)
#define CAST_SRC_KERNELS(K) CAST_SRC_KERNELS_L(K, 0) CAST_SRC_KERNELS_L(K, 1)
CAST_SRC_KERNELS(1)
CAST_SRC_KERNELS(2)
CAST_SRC_KERNELS(3)
CAST_SRC_KERNELS(4)
CAST_SRC_KERNELS(5)
CAST_SRC_KERNELS(6)
CAST_SRC_KERNELS(7)
CAST_SRC_KERNELS(8)
#else

// The step's casts' statistics reductions (capture/src/backend/cuda/stat_batch.rs): a table in
// device memory of one job a cast, STAT_JOB_WORDS words each: the address of the cast's `blocks`
// partials (field-major), of its record, then its blocks in the low half and its statistics level
// in the high half of the third word. Reduced at that level into record[STAT_FIELDS].
#define STAT_JOB_WORDS 3
struct StatJob {
    const double* parts;
    double* record;
    int blocks, level;
};

template <int L>
__device__ void reduce_job(const StatJob& t) {
    __shared__ double sh[STAT_FIELDS * 32];
    __shared__ double res[STAT_FIELDS];
    reduce_partials<L>(t.parts, (u64)t.blocks, sh, res);
    if (threadIdx.x < STAT_FIELDS) t.record[threadIdx.x] = res[threadIdx.x];
}

// Block j reduces job j of the table (launch: one block of CAST_THREADS a job, the cast kernels'
// block size, which fixes the order of the sums).
extern "C" __global__ void __launch_bounds__(CAST_THREADS) cast_stats_reduce(const u64* __restrict__ jobs) {
    const u64* j = jobs + (u64)blockIdx.x * STAT_JOB_WORDS;
    u64 bl = __ldg(j + 2);
    StatJob t{reinterpret_cast<const double*>(__ldg(j)), reinterpret_cast<double*>(__ldg(j + 1)), (int)(u32)bl, (int)(bl >> 32)};
    if (t.level == 0) reduce_job<0>(t);
    else if (t.level == 1) reduce_job<1>(t);
    else reduce_job<2>(t);
}

// out[i] = h[i]: a BF16 buffer's values widened to f32 (exact), for the casts that read only f32
// buffers (bf16_operands.rs: the statistics' full level, the BF16 shadow GEMMs, rows whose width
// is not a multiple of 4).
extern "C" __global__ void widen_bf16(float* __restrict__ out, const unsigned short* __restrict__ h, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        out[i] = __uint_as_float((u32)h[i] << 16);
    }
}

// x[i] = round_bf16(x[i]) in place.
extern "C" __global__ void round_bf16_fwd(float* __restrict__ x, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] = round_bf16(x[i]);
    }
}
#endif  // CAST_SRC_UNIT
