// Cross-entropy over the vocabulary, forward and backward in one pass per row:
// losses[row] = log(sum exp(x - max)) - (x[target] - max) (the sum in f64, as on the CPU);
// then the row of logits is overwritten in place with dlogits = (softmax - onehot) * dloss (the
// logits are not needed after the loss; a second (N,V) buffer would cost a gigabyte at V = 32000).
// A target of IGNORE_TARGET (0xFFFFFFFF, PyTorch's ignore_index) marks an unsupervised position:
// its loss and its gradient row are 0 (as on the CPU).
// Launch: one block (LOSS_THREADS) per row; reductions are fixed-order trees.
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

extern "C" __global__ void __launch_bounds__(LOSS_THREADS) crossentropy_fwd(
    float* __restrict__ losses, float* logits, const u32* __restrict__ targets, int v, float dloss) {
    __shared__ float sh[32];
    u64 row = blockIdx.x;
    u32 tg = targets[row];
    float* x = logits + row * v;
    if (tg == IGNORE_TARGET) {  // uniform over the block: no thread reaches a barrier
        for (int i = threadIdx.x; i < v; i += blockDim.x) x[i] = 0.0f;
        if (threadIdx.x == 0) losses[row] = 0.0f;
        return;
    }
    // Read before the barriers below: the row is overwritten with its gradient after them.
    float xt = x[tg];
    float m = -INFINITY;
    for (int i = threadIdx.x; i < v; i += blockDim.x) m = fmaxf(m, x[i]);
    m = block_reduce_f(m, true, sh);
    __shared__ double shd[32];
    double sd = 0.0;
    for (int i = threadIdx.x; i < v; i += blockDim.x) sd += (double)expf(x[i] - m);
    sd = block_sum_d(sd, shd);
    __shared__ double total;
    if (threadIdx.x == 0) total = sd;
    __syncthreads();
    double s = total;
    float inv = (float)(1.0 / s);
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        float p = expf(x[i] - m) * inv;
        x[i] = (p - (i == (int)tg ? 1.0f : 0.0f)) * dloss;
    }
    if (threadIdx.x == 0) losses[row] = (float)(log(s) - (double)(xt - m));
}
