// Token embedding. Forward: out (N, C) = wte[tokens]. Backward: dwte (V, C) += the rows of dout
// gathered by token. The backward is deterministic without atomics: the host groups the positions of
// each distinct token (CSR: uniq[u], offsets[u..u+1] into positions), and one thread per (token,
// column) sums its positions in order.
#include "common.cuh"

// Launch: grid-stride over N*C.
extern "C" __global__ void embedding_fwd(float* __restrict__ out, const u32* __restrict__ tokens,
                                         const float* __restrict__ wte, u64 n, int c) {
    u64 total = n * (u64)c;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 row = i / c;
        int col = (int)(i % c);
        out[i] = wte[(u64)tokens[row] * c + col];
    }
}

// Launch: grid (n_uniq, ceil(C / blockDim.x)).
extern "C" __global__ void embedding_bwd(float* __restrict__ dwte, const float* __restrict__ dout,
                                         const u32* __restrict__ uniq, const u32* __restrict__ offsets,
                                         const u32* __restrict__ positions, int c) {
    int u = blockIdx.x;
    int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= c) return;
    // Added one position at a time, in position order: the CPU reference's exact sequence.
    u64 o = (u64)uniq[u] * c + col;
    float acc = dwte[o];
    for (u32 p = offsets[u]; p < offsets[u + 1]; p++) acc += dout[(u64)positions[p] * c + col];
    dwte[o] = acc;
}
