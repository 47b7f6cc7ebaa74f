// The statistics a cast reduces as it writes its codes (part of cast.cu's translation unit,
// pasted in after common.cuh and cast.cu's sizes; not compiled alone): the per-thread
// accumulators (Acc), the block and grid reductions in a fixed order (block_reduce_stats,
// reduce_partials, stats_commit), and one value's cast with its statistics (cast_one) or, for a
// plain value, its moments alone (plain_stats, plain_row).
//
// Stat fields, in order (keep in step with backend/cuda/mod.rs: Stat):
//  0 finite count, 1 sum, 2 sum of squares, 3 min, 4 max, 5 amax, 6 min |x| over non-zeros,
//  7 underflow, 8 saturated, 9 NaN, 10 Inf, 11 zeros, 12 sum (dq-x)^2, 13 sum dq*x, 14 sum dq^2,
//  15 sum x^2, 16 pairs counted for the error.

#define STAT_FIELDS 17

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
        bool ovf = overflow_nan && isfinite(y) && fabsf(y) >= fmt_overflow(FMT);
        q = ovf ? (u8)(fmt_overflow_code(FMT) | (y < 0.0f ? 0x80 : 0)) : q;
        sat = sat && !ovf;
        if (fmt_overflows_to_inf(FMT)) a.inf_ += ovf; else a.nan_ += ovf;
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
