/* What the loader checks before it binds anything: the ABI version, the size of each struct the Python side
 * mirrors, the sources the library was built from, and whether this CPU runs the build's instructions. */

#include "day0_internal.h"

#ifndef DAY0_SOURCE_DIGEST /* the build passes -DDAY0_SOURCE_DIGEST="<sha256 of the sources>" */
#define DAY0_SOURCE_DIGEST "unknown"
#endif

int day0_abi_version(void) { return DAY0_ABI_VERSION; }

int64_t day0_struct_size(int which) {
    switch (which) {
    case DAY0_STRUCT_LAYER:
        return (int64_t)sizeof(struct day0_layer);
    case DAY0_STRUCT_COMM:
        return (int64_t)sizeof(struct day0_comm);
    default:
        return -1;
    }
}

const char *day0_source_digest(void) { return DAY0_SOURCE_DIGEST; }

/* A library built elsewhere (python -m agents.runtime.kernels build) for another CPU would die on an illegal
 * instruction at the first kernel call: the loader asks first. The sets checked are those that pick the code
 * paths and widths here; compiled without optimisation so that this check runs no instruction it checks for. */
__attribute__((optimize("O0"))) int day0_cpu_supported(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
#if defined(__AVX512F__)
    if (!__builtin_cpu_supports("avx512f")) return 0;
#endif
#if defined(__AVX512VL__)
    if (!__builtin_cpu_supports("avx512vl")) return 0;
#endif
#if defined(__AVX512BW__)
    if (!__builtin_cpu_supports("avx512bw")) return 0;
#endif
#if defined(__AVX512DQ__)
    if (!__builtin_cpu_supports("avx512dq")) return 0;
#endif
#if defined(__AVX2__)
    if (!__builtin_cpu_supports("avx2")) return 0;
#endif
#if defined(__FMA__)
    if (!__builtin_cpu_supports("fma")) return 0;
#endif
#if defined(__AVX__)
    if (!__builtin_cpu_supports("avx")) return 0;
#endif
#endif
    return 1;
}

int day0_vector_width(void) { return DAY0_VL; }
