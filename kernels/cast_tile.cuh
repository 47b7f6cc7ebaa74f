// The tiles of cast.cu's transposed casts (part of its translation unit, pasted in after
// cast_stats.cuh; not compiled alone): a thread's 4 x 4 share of a 64 x 64 tile loaded
// (load_tile), cast into the shared tile of codes with its statistics and channel partials
// (cast_tile_part: whole rows of 4 at once, plain rows on the short path), and the BF16 codes'
// column sums (tile_column_sums).

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

// The shared tile of cast_transposed's codes: BF16 codes as u16 (rows padded by one word), FP8
// codes as bytes, rows of TILE + 4 so that a thread's 4 codes of a row are one aligned u32 (the
// tile itself is declared ALIGN-byte aligned: a byte array alone is not). A BF16 row is 33 words,
// so that in a word-aligned tile two adjacent codes of a row are one aligned word too
// (tile_column_sums reads them so).
template <int FMT> struct CodeTile {
    typedef unsigned short T;
    static constexpr int W = TILE + 2, ALIGN = 2;
};
#define CODE_TILE_FP8(A, F)          \
    template <> struct CodeTile<F> { \
        typedef u8 T;                \
        static constexpr int W = TILE + 4, ALIGN = 4; \
    };
FOR_EACH_FP8_FMT(CODE_TILE_FP8, _)

// Four values scaled by s and cast to FP8 (cvt.rn.satfinite, two at a time), packed into a word in
// order (y[0] in the low byte): the codes to_fp8 gives one at a time. y[] gets the scaled values.
template <int FMT>
__device__ __forceinline__ u32 fp8x4(const float (&v)[4], float s, float (&y)[4]) {
#pragma unroll
    for (int k = 0; k < 4; k++) y[k] = v[k] * s;
    __nv_fp8_interpretation_t t = fmt_interp(FMT);
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
