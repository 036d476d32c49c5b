/* The shared-memory all-reduce of the ranks of one host (agents/runtime/shm_allreduce.py owns the segment). */

#include "day0_internal.h"

/* The segment: one 64-byte line per rank holding the last sequence number it published, one abort line, then two
 * sets (by the parity of seq) of `world` slots of `slot` floats. A rank copies x into its slot, publishes seq,
 * waits until every rank has published seq, and sums the slots in rank order (every rank gets the same bits).
 * Two sets suffice: a rank that writes call seq + 2 has seen every rank publish seq + 1, so all of them are done
 * reading call seq. */
static float *day0_shm_slots(char *seg, int64_t world, int64_t slot, int64_t seq) {
    return (float *)(seg + (world + 1) * 64) + (seq & 1) * world * slot;
}

/* Copy x [n] into this rank's slot of call seq, publish seq, wait for every rank's: 0 all there, -1 when `budget_s`
 * seconds passed with a rank missing (copying and publishing again are harmless), -2 when a rank set abort. */
static int day0_shm_publish_wait(const float *x, int64_t n, char *seg, int64_t rank, int64_t world, int64_t slot,
                                 int64_t seq, double budget_s) {
    float *slots = day0_shm_slots(seg, world, slot, seq);
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
    return 0;
}

/* element i of the slots summed in rank order */
static inline float day0_shm_sum(const float *slots, int64_t i, int64_t world, int64_t slot) {
    float sum = slots[i];
    for (int64_t r = 1; r < world; ++r) sum += slots[r * slot + i];
    return sum;
}

/* Whether process `pid` still runs: /proc/<pid>/stat exists and its state is not zombie or dead. */
static int day0_pid_alive(int64_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses: the state follows the last */
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* One call (seq = ++comm->seq) published and waited for, by one thread: 0, or DAY0_COMM_* with comm->failed set to
 * the rank found gone. The wait returns every poll_s to check the peers' processes, and gives up after timeout_s. */
static int day0_comm_wait(const float *x, int64_t n, struct day0_comm *c) {
    const int64_t seq = ++c->seq;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        const int rc = day0_shm_publish_wait(x, n, c->seg, c->rank, c->world, c->slot, seq, c->poll_s);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (rc != -1) {
            c->wait_s += waited;
            c->calls += 1;
            return rc == -2 ? DAY0_COMM_ABANDONED : 0;
        }
        for (int64_t r = 0; r < c->world; ++r)
            if (r != c->rank && !day0_pid_alive(c->pids[r])) {
                c->failed = r;
                return DAY0_COMM_GONE;
            }
        if (waited > c->timeout_s) return DAY0_COMM_TIMEOUT;
    }
}

/* The all-reduce of x [n] in place, called by every thread of the enclosing parallel region: one thread publishes
 * and waits, all of them add the slots (pieces of comm->slot floats, as the Python side cuts them). 0, or the
 * failure (the same value on every thread). */
static int day0_team_allreduce(float *x, int64_t n, struct day0_comm *c, int *shared_rc) {
    for (int64_t lo = 0; lo < n; lo += c->slot) {
        const int64_t len = n - lo < c->slot ? n - lo : c->slot;
#pragma omp single
        *shared_rc = day0_comm_wait(x + lo, len, c);
        /* the single's barrier: every thread sees the result and the sequence number */
        if (*shared_rc) return *shared_rc;
        const float *slots = day0_shm_slots(c->seg, c->world, c->slot, c->seq);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < len; ++i) x[lo + i] = day0_shm_sum(slots, i, c->world, c->slot);
        /* the for's barrier: every thread is done reading the slots before a later call publishes again */
    }
    return 0;
}

/* All-reduce (sum) of fp32 x [n] in place over the ranks of one host through comm's segment, in pieces of
 * comm->slot floats, each on the next sequence number: the collective day0_team_allreduce makes inside a native
 * run, as a call of its own (distributed.ShmAllReduce). 0, or DAY0_COMM_* with comm->failed set for a rank gone. */
int day0_shm_allreduce(float *x, int64_t n, struct day0_comm *c) {
    for (int64_t lo = 0; lo < n; lo += c->slot) {
        const int64_t len = n - lo < c->slot ? n - lo : c->slot;
        const int rc = day0_comm_wait(x + lo, len, c);
        if (rc) return rc;
        const float *slots = day0_shm_slots(c->seg, c->world, c->slot, c->seq);
#pragma omp parallel for schedule(static) if (len * c->world >= DAY0_PAR_MIN)
        for (int64_t i = 0; i < len; ++i) x[lo + i] = day0_shm_sum(slots, i, c->world, c->slot);
    }
    return 0;
}
