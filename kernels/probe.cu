// Measurement aids, not part of any step's math. hold_device keeps the stream busy for `ns`
// nanoseconds of the GPU's global timer: queued at the start of a step (FP8SCOPE_LEAD_US, see
// capture/src/backend/cuda/probe.rs), it lets the host queue the whole step before the GPU starts
// it, and the GPU start it rested (below its power limit): bench/power.sh compares such steps.
#include "common.cuh"

// Launch: one block of one thread.
extern "C" __global__ void hold_device(u64 ns) {
    u64 t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
