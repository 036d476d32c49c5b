/* What the kernel files share and the Python side does not see: the build's vector width and register count, the
 * vector types, e^x on a vector, horizontal sums, partial loads. Every kernel file includes this first; the build
 * compiles them as one translation unit (day0_kernels.c), so these static helpers are one copy. */
#ifndef DAY0_INTERNAL_H
#define DAY0_INTERNAL_H

#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "day0_kernels.h"

#define DAY0_CHUNK 32 /* keys scored at once by the decode attention (online softmax across chunks) */
#define DAY0_PAR_MIN 32768 /* elements below which a kernel stays on the calling thread */

/* The vectors are the machine's own width: gcc lowers a wider generic vector into halves that it keeps in
 * memory, so a 64-byte accumulator on an AVX2-only host (AVX-512 hidden by a hypervisor, older or smaller
 * cores) went through the stack on every multiply-add and the kernels ran 5-10x slower than torch there.
 * DAY0_NREGS, the vector registers, sizes the register tiles. */
#if defined(__AVX512F__)
#define DAY0_VL 16
#define DAY0_NREGS 32
#elif defined(__AVX2__)
#define DAY0_VL 8
#define DAY0_NREGS 16
#elif defined(__aarch64__)
#define DAY0_VL 4
#define DAY0_NREGS 32
#else
#define DAY0_VL 4
#define DAY0_NREGS 16
#endif
typedef float day0_vf __attribute__((vector_size(DAY0_VL * 4)));
typedef int32_t day0_vi __attribute__((vector_size(DAY0_VL * 4)));
typedef float day0_v8f __attribute__((vector_size(32)));
typedef float day0_v4f __attribute__((vector_size(16)));

/* e^x on a vector for x <= ~88; below -87.3 it gives ~1.6e-38 instead of 0 (irrelevant after the sums it
 * feeds). Cody-Waite range reduction and a degree-6 polynomial (Cephes' expf coefficients), ~1 ulp, written in
 * GCC vector extensions: libm's expf is a scalar call that stops the loops around it from vectorising. */
static inline day0_vf day0_expv(day0_vf x) {
    const day0_vf hi = (day0_vf){0} + 88.37f, lo = (day0_vf){0} - 87.33f;
    day0_vi above = x > hi, below = x < lo; /* lanes of -1 where true (C has no vector ?:) */
    x = (day0_vf)(((day0_vi)hi & above) | ((day0_vi)x & ~above));
    x = (day0_vf)(((day0_vi)lo & below) | ((day0_vi)x & ~below));
    const day0_vf t = x * 1.44269504088896341f + 0.5f;
    day0_vf k = __builtin_convertvector(__builtin_convertvector(t, day0_vi), day0_vf); /* toward zero */
    k += __builtin_convertvector(k > t, day0_vf); /* floor: -1 where truncation rounded up */
    const day0_vf r = x - k * 0.693359375f - k * -2.12194440e-4f;
    day0_vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const day0_vf y = p * r * r + r + 1.0f;
    const day0_vi bits = (__builtin_convertvector(k, day0_vi) + 127) << 23;
    return y * (day0_vf)bits;
}

static inline float day0_exp1(float x) {
    day0_vf v = {0};
    v[0] = x;
    return day0_expv(v)[0];
}

/* the lanes' sum, halves added pairwise */
static inline float day0_hsum4(day0_v4f c) { return (c[0] + c[2]) + (c[1] + c[3]); }

static inline float day0_hsum8(day0_v8f a) {
    day0_v4f c, d;
    memcpy(&c, &a, sizeof c);
    memcpy(&d, (const char *)&a + sizeof c, sizeof d);
    return day0_hsum4(c + d);
}

static inline float day0_hsum(day0_vf v) {
#if DAY0_VL == 16
    day0_v8f a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, (const char *)&v + sizeof a, sizeof b);
    return day0_hsum8(a + b);
#elif DAY0_VL == 8
    return day0_hsum8(v);
#else
    return day0_hsum4(v);
#endif
}

/* DAY0_VL floats from p, of which only the first n (1..DAY0_VL) are read; the rest are 0 */
static inline day0_vf day0_load_n(const float *p, int64_t n) {
    day0_vf v = {0};
    if (n == DAY0_VL)
        memcpy(&v, p, sizeof v);
    else
        memcpy(&v, p, sizeof(float) * n);
    return v;
}

#endif
