// Cross-entropy over the vocabulary, forward and backward in one pass per row:
// losses[row] = log(sum exp(x - max)) - (x[target] - max) (the sum in f64, as on the CPU);
// then the row of logits is overwritten in place with dlogits = (softmax - onehot) * dloss (the
// logits are not needed after the loss; a second (N,V) buffer would cost a gigabyte at V = 32000).
// A target of IGNORE_TARGET (0xFFFFFFFF, PyTorch's ignore_index) marks an unsupervised position:
// its loss and its gradient row are 0 (as on the CPU). The logits are f32, or BF16 with x_bf16 (the
// lm_head writes them so); their gradient is written in the same storage, rounded to BF16 (to
// nearest even) in the second case: the operand the lm_head's backward then takes as it is.
// Launch: one block (LOSS_THREADS) per row; reductions are fixed-order trees.
// Three kernels. Two share one body (crossentropy_row): crossentropy_fwd reads the row from memory
// in each of its three passes (max, sum, gradient); crossentropy_smem_fwd first copies it into shared memory
// (dynamic, V floats: one block an SM at V = 32000) and runs the passes there, one read of the
// logits instead of three (capture/src/backend/cuda/loss.rs picks it where the row fits), and one
// exp a logit instead of two. The threads take the same elements in the same order in both: the
// same losses and dlogits, bit for bit.
#include "common.cuh"

#define LOSS_THREADS 512
#define IGNORE_TARGET 0xFFFFFFFFu

__device__ float block_reduce_f(float v, bool is_max, float* sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float r = lane < nw ? sh[lane] : (is_max ? -INFINITY : 0.0f);
        r = is_max ? warp_max(r) : warp_sum(r);
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}

// Logit i of a row held in f32, or in BF16 with bf16 (the lm_head's output stored in 16 bits).
// Plain loads, not __ldg: the kernels below overwrite the row with its gradient.
__device__ __forceinline__ float logit_at(const void* x, int i, int bf16) {
    return bf16 ? __uint_as_float((u32)reinterpret_cast<const unsigned short*>(x)[i] << 16) : reinterpret_cast<const float*>(x)[i];
}

// Its gradient g written over logit i: as f32, or with bf16 rounded to BF16 (to nearest even:
// the operand the lm_head's backward would otherwise cast it to).
__device__ __forceinline__ void set_logit(void* x, int i, int bf16, float g) {
    if (bf16) {
        __nv_bfloat16 b = __float2bfloat16_rn(g);
        reinterpret_cast<unsigned short*>(x)[i] = *reinterpret_cast<unsigned short*>(&b);
    } else {
        reinterpret_cast<float*>(x)[i] = g;
    }
}

// Row `row` of the logits (v of them, f32 or BF16).
__device__ __forceinline__ void* logit_row(void* logits, u64 row, int v, int bf16) {
    return bf16 ? (void*)(reinterpret_cast<unsigned short*>(logits) + row * v) : (void*)(reinterpret_cast<float*>(logits) + row * v);
}

// An unsupervised row (target IGNORE_TARGET): its loss and its gradient row are 0, and the row's
// block is done (the target is the same for the whole block: no thread reaches a barrier).
__device__ __forceinline__ bool ignored_row(float* __restrict__ losses, void* x, int x_bf16, u64 row, u32 tg, int v) {
    if (tg != IGNORE_TARGET) return false;
    for (int i = threadIdx.x; i < v; i += blockDim.x) set_logit(x, i, x_bf16, 0.0f);
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return true;
}

template <bool SMEM>
__device__ __forceinline__ void crossentropy_row(float* __restrict__ losses, void* logits, int x_bf16, const u32* __restrict__ targets,
                                                 int v, float dloss) {
    __shared__ float sh[32];
    extern __shared__ float4 row_sh[];
    u64 row = blockIdx.x;
    u32 tg = targets[row];
    void* x = logit_row(logits, row, v, x_bf16);
    if (ignored_row(losses, x, x_bf16, row, tg, v)) return;
    // Read before the barriers below: the row is overwritten with its gradient after them.
    float xt = logit_at(x, tg, x_bf16);
    // The passes below read the row in memory, or (SMEM) its f32 copy rs in shared memory.
    float* rs = reinterpret_cast<float*>(row_sh);
    if (SMEM) {
        if ((v & 3) == 0 && x_bf16) {  // rows of whole groups of 4 BF16 values, 8-byte aligned
            const uint2* x4 = reinterpret_cast<const uint2*>(x);
#pragma unroll 4
            for (int i = threadIdx.x; i < v / 4; i += blockDim.x) {
                float w[4];
                unpack_bf16x4(x4[i], w);
                row_sh[i] = make_float4(w[0], w[1], w[2], w[3]);
            }
        } else if ((v & 3) == 0) {  // rows of whole float4s, 16-byte aligned
            const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 4
            for (int i = threadIdx.x; i < v / 4; i += blockDim.x) row_sh[i] = x4[i];
        } else {
            for (int i = threadIdx.x; i < v; i += blockDim.x) rs[i] = logit_at(x, i, x_bf16);
        }
        __syncthreads();
    }
    float m = -INFINITY;
    for (int i = threadIdx.x; i < v; i += blockDim.x) m = fmaxf(m, SMEM ? rs[i] : logit_at(x, i, x_bf16));
    m = block_reduce_f(m, true, sh);
    __shared__ double shd[32];
    // With the row in shared memory, each exp(x - max) replaces its logit there, and the gradient
    // pass reads it back instead of computing it again: each thread reads back only the values it
    // wrote, and the same values, so the bits do not change.
    double sd = 0.0;
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        float e = expf((SMEM ? rs[i] : logit_at(x, i, x_bf16)) - m);
        if (SMEM) rs[i] = e;
        sd += (double)e;
    }
    sd = block_sum_d(sd, shd);
    __shared__ double total;
    if (threadIdx.x == 0) total = sd;
    __syncthreads();
    double s = total;
    float inv = (float)(1.0 / s);
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        float p = (SMEM ? rs[i] : expf(logit_at(x, i, x_bf16) - m)) * inv;
        set_logit(x, i, x_bf16, (p - (i == (int)tg ? 1.0f : 0.0f)) * dloss);
    }
    if (threadIdx.x == 0) losses[row] = (float)(log(s) - (double)(xt - m));
}

// The logits are f32, or BF16 with x_bf16 (then so is their gradient, rounded to nearest even).
extern "C" __global__ void __launch_bounds__(LOSS_THREADS) crossentropy_fwd(
    float* __restrict__ losses, void* logits, int x_bf16, const u32* __restrict__ targets, int v, float dloss) {
    crossentropy_row<false>(losses, logits, x_bf16, targets, v, dloss);
}

// Launch: dynamic shared memory of v floats.
extern "C" __global__ void __launch_bounds__(LOSS_THREADS) crossentropy_smem_fwd(
    float* __restrict__ losses, void* logits, int x_bf16, const u32* __restrict__ targets, int v, float dloss) {
    crossentropy_row<true>(losses, logits, x_bf16, targets, v, dloss);
}

// crossentropy_split_fwd: the first LOSS_REG_SPAN logits of the row in registers (thread t holds
// t, t + LOSS_THREADS, ..., LOSS_REG of them, loaded all at once), the rest in dynamic shared memory
// (v - LOSS_REG_SPAN floats: 93 KB at V = 32000), so that two blocks share an
// SM and one's reads and writes of the logits overlap the other's arithmetic (one block an SM
// left the memory idle while it computed). A thread takes the same elements in the same order as
// in the two kernels above, and the same operations on them: the same losses and dlogits, bit for
// bit. Launch: dynamic shared memory of max(v - LOSS_REG_SPAN, 0) floats.
// 16 logits a thread in registers: with 32, the registers that hold their loads in flight spill.
#define LOSS_REG 16
#define LOSS_REG_SPAN (LOSS_REG * LOSS_THREADS)

template <int BF16>
__device__ __forceinline__ void crossentropy_split_row(float* __restrict__ losses, void* logits, const u32* __restrict__ targets, int v, float dloss) {
    __shared__ float sh[32];
    __shared__ double shd[32];
    __shared__ double total;
    extern __shared__ float4 rest_sh[];
    float* rest = reinterpret_cast<float*>(rest_sh);  // logit i >= LOSS_REG_SPAN at rest[i - LOSS_REG_SPAN]
    u64 row = blockIdx.x;
    u32 tg = targets[row];
    void* x = logit_row(logits, row, v, BF16);
    if (ignored_row(losses, x, BF16, row, tg, v)) return;
    float xt = logit_at(x, tg, BF16);
    float rr[LOSS_REG];
    float m = -INFINITY;
    // All of a thread's register loads are issued before the first is used: each index is clamped
    // into the row and what lies past it is zeroed after the load. (Loaded under `i < v`, each
    // load sat in a branch with its use, and the thread waited for each in turn: the kernel ran
    // at a third of the memory's bandwidth.)
    if (v >= LOSS_REG_SPAN) {
        // Every index lies in the row (V = 32000 and the like): nothing to clamp.
        const void* mine = BF16 ? (const void*)((const unsigned short*)x + threadIdx.x) : (const void*)((const float*)x + threadIdx.x);
#pragma unroll
        for (int k = 0; k < LOSS_REG; k++) rr[k] = logit_at(mine, k * LOSS_THREADS, BF16);
    } else {
#pragma unroll
        for (int k = 0; k < LOSS_REG; k++) rr[k] = logit_at(x, min(threadIdx.x + k * LOSS_THREADS, v - 1), BF16);
    }
#pragma unroll
    for (int k = 0; k < LOSS_REG; k++) {
        int i = threadIdx.x + k * LOSS_THREADS;
        rr[k] = i < v ? rr[k] : 0.0f;
        if (i < v) m = fmaxf(m, rr[k]);
    }
#pragma unroll 8
    for (int i = LOSS_REG_SPAN + threadIdx.x; i < v; i += LOSS_THREADS) {
        float y = logit_at(x, i, BF16);
        rest[i - LOSS_REG_SPAN] = y;
        m = fmaxf(m, y);
    }
    m = block_reduce_f(m, true, sh);
    double sd = 0.0;
#pragma unroll
    for (int k = 0; k < LOSS_REG; k++) {
        if (threadIdx.x + k * LOSS_THREADS < v) {
            float e = expf(rr[k] - m);
            rr[k] = e;
            sd += (double)e;
        }
    }
    for (int i = LOSS_REG_SPAN + threadIdx.x; i < v; i += LOSS_THREADS) {
        float e = expf(rest[i - LOSS_REG_SPAN] - m);
        rest[i - LOSS_REG_SPAN] = e;
        sd += (double)e;
    }
    sd = block_sum_d(sd, shd);
    if (threadIdx.x == 0) total = sd;
    __syncthreads();
    double s = total;
    float inv = (float)(1.0 / s);
#pragma unroll
    for (int k = 0; k < LOSS_REG; k++) {
        int i = threadIdx.x + k * LOSS_THREADS;
        if (i < v) {
            float p = rr[k] * inv;
            set_logit(x, i, BF16, (p - (i == (int)tg ? 1.0f : 0.0f)) * dloss);
        }
    }
    for (int i = LOSS_REG_SPAN + threadIdx.x; i < v; i += LOSS_THREADS) {
        float p = rest[i - LOSS_REG_SPAN] * inv;
        set_logit(x, i, BF16, (p - (i == (int)tg ? 1.0f : 0.0f)) * dloss);
    }
    if (threadIdx.x == 0) losses[row] = (float)(log(s) - (double)(xt - m));
}

extern "C" __global__ void __launch_bounds__(LOSS_THREADS, 2) crossentropy_split_fwd(
    float* __restrict__ losses, void* logits, int x_bf16, const u32* __restrict__ targets, int v, float dloss) {
    // One body a storage (a runtime choice inside the unrolled loops spilled).
    if (x_bf16) crossentropy_split_row<1>(losses, logits, targets, v, dloss);
    else crossentropy_split_row<0>(losses, logits, targets, v, dloss);
}
