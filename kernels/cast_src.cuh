// The computed sources of cast.cu's casts (part of its translation unit, pasted in after
// activations.cuh, norms.cuh and cast_tile.cuh; not compiled alone): the kinds of value a
// cast_src_* kernel computes from a layer's saved inputs instead of reading x (CastSrc), and
// their loads and element math.

// Values a cast computes as it reads them (the cast_src_* kernels) instead of reading x, from the
// saved inputs of the layer that would otherwise have written x first; the element math is
// activations.cuh's (and norms.cuh's), so the values, and the codes, are those of the unfused pair
// of kernels. For the activation kinds (1 to 5, 9), h and b hold BF16 values (the GEMM outputs they are), and every row of them and of x has a multiple of
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
// SRC_DSWIGLU_PAIRS whose channel partials add up over a block's run of tiles down one column
// pair, as a plain cast's do (cast_transposed), instead of leaving once a tile: with a grid
// aligned to the gate half's column tiles, a column gets a few slots instead of one a row tile.
// Each half's partials take 8 rows of csq / cam, two row groups combined in the warp first.
#define SRC_DSWIGLU_PAIR_RUNS 9
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

// Whether kind K casts SwiGLU's backward by pairs of tiles (SRC_DSWIGLU_PAIRS, SRC_DSWIGLU_PAIR_RUNS).
template <int K> struct SrcPairs {
    static constexpr bool V = K == SRC_DSWIGLU_PAIRS || K == SRC_DSWIGLU_PAIR_RUNS;
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
    bool swiglu_bwd = K == SRC_DSWIGLU || SrcPairs<K>::V;
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
            } else if (K == SRC_DSWIGLU || SrcPairs<K>::V) {
                float dg, du;
                dswiglu_one(a[k], u[k], d[k], dg, du);
                v[q][k] = K == SRC_DSWIGLU && up ? du : dg;
                if (SrcPairs<K>::V) w[q][k] = du;
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
