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
// The parts, pasted in below: cast_stats.cuh (the statistics: its head lists the fields, in
// order), cast_tile.cuh (a tile's cast), cast_src.cuh (the computed sources). This file has the
// straight and transposed casts and the kernels.
#include "common.cuh"
#include "activations.cuh"
#include "norms.cuh"

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

#include "cast_stats.cuh"

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

#include "cast_tile.cuh"
#include "cast_src.cuh"

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
// every run is then one tile (the slot its row tile). With SRC_DSWIGLU_PAIR_RUNS the runs are as
// a plain cast's (a grid aligned to the gate half's column tiles: runs down one column pair),
// each half's partials in 8 rows of csq / cam.
template <int FMT, int L, int SRC = 0>
__device__ void cast_transposed(CAST_PARAMS, CastSrc src, Grid g) {
    constexpr bool PAIRS = SrcPairs<SRC>::V;
    constexpr bool PAIR_RUNS = SRC == SRC_DSWIGLU_PAIR_RUNS;
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
    bool one_tile_runs = (PAIRS && !PAIR_RUNS) || step_c != 0;
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
        // SRC_DSWIGLU_PAIR_RUNS: 1 for a pair tile (the up half's rows of csq / cam).
        int half = PAIR_RUNS && c0 >= pair_off ? 1 : 0;
        int c = c0 + 4 * tx;
        double sq[4] = {0.0, 0.0, 0.0, 0.0};
        float am[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        cast_tile_part<FMT, L>(vv, r0, c, rows, cols, tx, ty, s, base, overflow_nan, o0, o1, o2, o3, outlier_factor, channels, a, tile, out, sq, am);
        if (channels) {
            // The tile's sum of squares, from its channel partials (cast_one and plain_row leave
            // it out when they sum those).
            a.sumsq += (sq[0] + sq[1]) + (sq[2] + sq[3]);
            bool run_start = one_tile_runs || tr == first_tr;
            if (PAIR_RUNS) {
                // Row groups ty and ty ^ 1 (lanes l and l ^ 16 of a warp, the same columns)
                // combined, then kept by the even one in its half's 8 rows.
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    sq[k] += __shfl_xor_sync(0xffffffffu, sq[k], 16);
                    am[k] = fmaxf(am[k], __shfl_xor_sync(0xffffffffu, am[k], 16));
                }
                int row = 8 * half + (ty >> 1);
                if ((ty & 1) == 0) {
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        csq[row][4 * tx + k] = run_start ? sq[k] : csq[row][4 * tx + k] + sq[k];
                        cam[row][4 * tx + k] = run_start ? am[k] : fmaxf(cam[row][4 * tx + k], am[k]);
                    }
                }
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    csq[ty][4 * tx + k] = run_start ? sq[k] : csq[ty][4 * tx + k] + sq[k];
                    cam[ty][4 * tx + k] = run_start ? am[k] : fmaxf(cam[ty][4 * tx + k], am[k]);
                }
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
            if (PAIR_RUNS) {
                // A half's 8 combined row groups: 2 for each of the 4 threads.
#pragma unroll
                for (int y = 0; y < 2; y++) {
                    cs += csq[8 * half + 2 * part + y][col];
                    cm = fmaxf(cm, cam[8 * half + 2 * part + y][col]);
                }
            } else {
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    cs += csq[4 * part + y][col];
                    cm = fmaxf(cm, cam[4 * part + y][col]);
                }
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
// cast_fwd_l{L}_f{F}_t{T} with F as FMT_* numbers it (every format of the contract: FOR_EACH_FMT): T = 0 writes out = cast(x) (x's layout),
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
#define CAST_KERNELS_L(L) FOR_EACH_FMT(CAST_KERNELS_F, L)
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
#define CAST_WEIGHTS_KERNELS_L(L) FOR_EACH_FP8_FMT(CAST_WEIGHTS_KERNEL, L)
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
#define CAST_SRC_KERNELS_L(K, L) FOR_EACH_FMT2(CAST_SRC_KERNEL, K, L)
#define CAST_SRC_KERNELS(K) CAST_SRC_KERNELS_L(K, 0) CAST_SRC_KERNELS_L(K, 1)
CAST_SRC_KERNELS(1)
CAST_SRC_KERNELS(2)
CAST_SRC_KERNELS(3)
CAST_SRC_KERNELS(4)
CAST_SRC_KERNELS(5)
CAST_SRC_KERNELS(6)
CAST_SRC_KERNELS(7)
CAST_SRC_KERNELS(8)
CAST_SRC_KERNELS(9)
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
