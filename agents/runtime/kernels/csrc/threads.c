/* Thread pinning: the calling thread's OpenMP team, one thread to a CPU (day0 serve --bind-threads). */

#include "day0_internal.h"

/* Pins the calling thread's OpenMP team, n threads, one to a CPU: thread i (the caller is thread 0) to cpus[i].
 * libgomp keeps a master's team for its later parallel regions, torch's included (one runtime, one pool), so the
 * pinning lasts. Returns the threads pinned (n when all were; fewer when a CPU was refused or the team smaller). */
int day0_bind_threads(const int *cpus, int n) {
    int bound = 0;
#pragma omp parallel num_threads(n) reduction(+ : bound)
    {
        const int i = omp_get_thread_num();
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[i], &set);
        bound += omp_get_num_threads() == n && sched_setaffinity(0, sizeof set, &set) == 0;
    }
    return bound;
}
