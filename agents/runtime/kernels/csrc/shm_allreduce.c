/* The shared-memory all-reduce of the ranks of one host (agents/runtime/shm_allreduce.py owns the segment). */

#include "day0_internal.h"

/* All-reduce (sum) of fp32 x [n] in place over the `world` ranks of one host through a shared segment: one 64-byte
 * line per rank holding the last sequence number it published, one abort line, then two sets (by the parity of
 * seq) of `world` slots of `slot` floats. A rank copies x into its slot, publishes seq, waits until every rank
 * has published seq, and sums the slots in rank order (every rank gets the same bits). Two sets suffice: a rank
 * that writes call seq + 2 has seen every rank publish seq + 1, so all of them are done reading call seq.
 * Returns 0 done, -1 when `budget_s` seconds passed with a rank missing (the caller checks its peers are alive
 * and calls again with the same seq: copying and publishing again are harmless), -2 when a rank set abort. */
int day0_shm_allreduce(float *x, int64_t n, char *seg, int64_t rank, int64_t world, int64_t slot, int64_t seq,
                       double budget_s) {
    float *slots = (float *)(seg + (world + 1) * 64) + (seq & 1) * world * slot;
    int64_t *flag = (int64_t *)(seg + rank * 64), *abort_flag = (int64_t *)(seg + world * 64);
    memcpy(slots + rank * slot, x, (size_t)n * sizeof(float));
    __atomic_store_n(flag, seq, __ATOMIC_RELEASE);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t r = 0; r < world; ++r) {
        const int64_t *peer = (const int64_t *)(seg + r * 64);
        for (int64_t spins = 1; __atomic_load_n(peer, __ATOMIC_ACQUIRE) < seq; ++spins) {
            if (__atomic_load_n(abort_flag, __ATOMIC_RELAXED)) return -2;
            if ((spins & 255) == 0) {
                clock_gettime(CLOCK_MONOTONIC, &t1);
                const double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
                if (waited > budget_s) return -1;
                if (waited > 1e-4) sched_yield(); /* a peer is late (descheduled): let the host's other threads run */
            }
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
    }
#pragma omp parallel for schedule(static) if (n * world >= DAY0_PAR_MIN)
    for (int64_t i = 0; i < n; ++i) {
        float sum = slots[i];
        for (int64_t r = 1; r < world; ++r) sum += slots[r * slot + i];
        x[i] = sum;
    }
    return 0;
}
