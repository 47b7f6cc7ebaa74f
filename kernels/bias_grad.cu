// The bias gradient of a linear layer (launched by capture/src/backend/cuda/bias_grad.rs; the CPU
// reference: capture/src/layers/linear.rs): the sums of dY's values as the wgrad GEMM read them,
// from its FP8 or BF16 cast (rowsum_dequant), or down the columns of a BF16 dY held in its own
// layout (colsum_bf16_partial, then colsum_bf16_reduce, which also adds the column sums a cast of
// dY took as it cast it: cast_tile.cuh's tile_column_sums). Every value is added in f64, where such sums
// are exact unless their exponents span about 2^29, so the three ways give the same bits.
#include "common.cuh"

// dbias[r] += sum over c of dequant(q[r][c]): the bias gradient from the (transposed) cast of dY, so
// that it sees the same values the wgrad GEMM multiplies. q: (rows, cols) BF16 bits or FP8 bytes.
// Each value (an FP8 code times the slot's inverse scale, rounded to f32, or a BF16 value) is added
// in f64, where such sums are exact unless their exponents span about 2^29: the order of the adds
// does not change the result. Each thread reads 16 bytes at a time (16 FP8 codes or 8 BF16 values),
// RS_BATCH loads in flight, when the row starts 16-byte aligned, the rest one value at a time.
// Launch: one block (256 threads) per row.
__device__ __forceinline__ double sum_fp8x16(uint4 w, int fmt, float inv) {
    __nv_fp8_interpretation_t t = fmt_interp(fmt);
    u32 words[4] = {w.x, w.y, w.z, w.w};
    double acc = 0.0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[j] >> (16 * h)), t);
            float2 f = __half22float2(__half2(r));
            acc += (double)(f.x * inv);
            acc += (double)(f.y * inv);
        }
    }
    return acc;
}

// The 8 BF16 values of a 16-byte load, in memory order (common.cuh: unpack_bf16x4).
__device__ __forceinline__ void unpack_bf16x8(uint4 w, float (&v)[8]) {
    float lo[4], hi[4];
    unpack_bf16x4(make_uint2(w.x, w.y), lo);
    unpack_bf16x4(make_uint2(w.z, w.w), hi);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[j] = lo[j];
        v[4 + j] = hi[j];
    }
}

__device__ __forceinline__ double sum_bf16x8(uint4 w) {
    float v[8];
    unpack_bf16x8(w, v);
    double acc = 0.0;
#pragma unroll
    for (int j = 0; j < 8; j++) acc += (double)v[j];
    return acc;
}

// The rowsum of one row, for one storage format: each thread takes the row's 16-byte words t,
// t + blockDim.x, ... in that order, RS_BATCH of them at a time with every load issued
// before the first sum (a word past the row is loaded from the row's last word, and its sum is not
// added: zeroing it instead would add 0 × inv, a NaN when a degenerate scale's inverse is Inf). The
// values left over past the row's last whole word (or the whole row, when it does not start
// 16-byte aligned) are added one at a time after.
#ifndef RS_BATCH
#define RS_BATCH 4
#endif
template <int FMT>
__device__ __forceinline__ double rowsum_row(const u8* __restrict__ row, int cols, float inv) {
    constexpr int PER16 = FMT == FMT_BF16 ? 8 : 16;
    int vec = ((u64)row & 15) == 0 ? cols / PER16 : 0;
    const uint4* row4 = (const uint4*)row;
    double acc = 0.0;
    for (int v0 = threadIdx.x; v0 < vec; v0 += RS_BATCH * blockDim.x) {
        uint4 w[RS_BATCH];
#pragma unroll
        for (int b = 0; b < RS_BATCH; b++) w[b] = __ldg(row4 + min(v0 + b * (int)blockDim.x, vec - 1));
#pragma unroll
        for (int b = 0; b < RS_BATCH; b++) {
            double t = FMT == FMT_BF16 ? sum_bf16x8(w[b]) : sum_fp8x16(w[b], FMT, inv);
            if (v0 + b * (int)blockDim.x < vec) acc += t;
        }
    }
    for (int c = vec * PER16 + threadIdx.x; c < cols; c += blockDim.x) {
        float v = FMT == FMT_BF16 ? load_value(row, c, 1) : from_fp8(row[c], FMT) * inv;
        acc += (double)v;
    }
    return acc;
}

extern "C" __global__ void rowsum_dequant(const void* __restrict__ q, int fmt, const float* __restrict__ slot,
                                          int rows, int cols, float* __restrict__ dbias) {
    __shared__ double sh[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const u8* row = (const u8*)q + (u64)r * cols * (fmt == FMT_BF16 ? 2 : 1);
    double acc;
    if (fmt == FMT_BF16) acc = rowsum_row<FMT_BF16>(row, cols, 1.0f);
#define ROWSUM_FP8(A, F) else if (fmt == F) acc = rowsum_row<F>(row, cols, slot[SLOT_INV]);
    FOR_EACH_FP8_FMT(ROWSUM_FP8, _)
    else __trap();
    double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) dbias[r] += (float)s;
}

// Column sums of a BF16 matrix q (rows x cols, row-major) into dbias: the bias gradient when the
// wgrad GEMM reads dY in its own layout (a BF16 operand held untransposed, so rowsum_dequant's
// rows are this matrix's columns). Summed in f64 as rowsum_dequant sums, then rounded once, so
// both give the same bias gradient (a sum of BF16 values in f64 is exact unless their exponents
// span about 2^29). colsum_bf16_partial: partial[chunk][col] = the sum of the chunk's rows, each
// lane summing 8 adjacent columns (one 16-byte load a row when cols is a multiple of 8 and q is
// 16-byte aligned); launch grid (ceil(cols / 256), chunks), block (32, 8). colsum_bf16_reduce:
// dbias[col] += the chunks' sums, warp g adding chunks g, g + 8, ... and warp 0 the eight warps'
// sums in order; launch ceil(cols / 32) blocks of (32, 8). Each lane of colsum_bf16_partial adds its
// rows in order, CS_BATCH 16-byte loads in flight (a chunk of 64 rows is one batch a lane).
#ifndef CS_BATCH
#define CS_BATCH 8
#endif
extern "C" __global__ void colsum_bf16_partial(const unsigned short* __restrict__ q, int rows, int cols,
                                               int rows_per_chunk, double* __restrict__ partial) {
    __shared__ double sh[8][256];
    int lane = threadIdx.x, g = threadIdx.y;
    int c0 = blockIdx.x * 256 + 8 * lane;
    int r0 = blockIdx.y * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
    bool vec = (cols & 7) == 0 && ((u64)q & 15) == 0 && c0 + 8 <= cols;
    double a[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    if (vec) {
        // CS_BATCH rows at a time (r, r + 8, ...), every load issued before the first add; a row
        // past the chunk is loaded from its last row and zeroed (+0.0 adds nothing).
        for (int r = r0 + g; r < r1; r += 8 * CS_BATCH) {
            uint4 w[CS_BATCH];
#pragma unroll
            for (int b = 0; b < CS_BATCH; b++) w[b] = __ldg((const uint4*)(q + (u64)min(r + 8 * b, r1 - 1) * cols + c0));
#pragma unroll
            for (int b = 0; b < CS_BATCH; b++) {
                if (r + 8 * b >= r1) w[b] = make_uint4(0u, 0u, 0u, 0u);
                float v[8];
                unpack_bf16x8(w[b], v);
#pragma unroll
                for (int j = 0; j < 8; j++) a[j] += (double)v[j];
            }
        }
    } else {
        for (int r = r0 + g; r < r1; r += 8) {
            const unsigned short* row = q + (u64)r * cols;
#pragma unroll
            for (int j = 0; j < 8; j++) a[j] += (double)(c0 + j < cols ? load_value(row, c0 + j, 1) : 0.0f);
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) sh[g][8 * lane + j] = a[j];
    __syncthreads();
    int t = g * 32 + lane, c = blockIdx.x * 256 + t;
    if (c >= cols) return;
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += sh[k][t];
    partial[(u64)blockIdx.y * cols + c] = s;
}

extern "C" __global__ void colsum_bf16_reduce(const double* __restrict__ partial, int cols, int chunks,
                                              float* __restrict__ dbias) {
    __shared__ double sh[8][32];
    int lane = threadIdx.x, g = threadIdx.y, c = blockIdx.x * 32 + lane;
    double s = 0.0;
    if (c < cols) {
#pragma unroll 4
        for (int k = g; k < chunks; k += 8) s += partial[(u64)k * cols + c];
    }
    sh[g][lane] = s;
    __syncthreads();
    if (g != 0 || c >= cols) return;
    double t = 0.0;
    for (int k = 0; k < 8; k++) t += sh[k][lane];
    dbias[c] += (float)t;
}
