// Measurement aids, not part of any step's math. hold_device keeps the stream busy for `ns`
// nanoseconds of the GPU's global timer: queued at the start of a step (FP8SCOPE_LEAD_US, see
// capture/src/backend/cuda/probe.rs), it lets the host queue the whole step before the GPU starts
// it, so that the step's time less the hold is the GPU's own time, with no wait for the host.
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
