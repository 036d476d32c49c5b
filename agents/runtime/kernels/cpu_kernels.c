/* Fused fp32 CPU kernels of the runtime's decoder step (agents/runtime/kernels/__init__.py builds and loads this
 * file once per source, compiler and CPU; the layers fall back to their torch code where it is not loaded).
 *
 * Each kernel replaces a chain of small torch ops with one call: at decode a layer's work is tiny and the step
 * was spending more time dispatching ops (and copying whole KV blocks for attention) than computing. The loops
 * are written so that gcc -O3 -march=native vectorises them; OpenMP is the same runtime torch uses (libgomp is
 * already loaded by torch under the same soname), so torch.set_num_threads() governs both. */

#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DAY0_MAX_HEAD_DIM 512
#define DAY0_MAX_GROUP 32
#define DAY0_CHUNK 32 /* keys scored at once by the decode attention (online softmax across chunks) */
#define DAY0_PAR_MIN 32768 /* elements below which a kernel stays on the calling thread */

int day0_abi_version(void) { return 7; }

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

int day0_vector_width(void) { return DAY0_VL; }

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

/* One row of each elementwise kernel, shared by the kernels below and the fused decode layers (day0_decode_layers),
 * so both compute every value the same way. */
static inline void day0_rms_row(float *o, const float *xr, const float *w, int64_t cols, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < cols; ++c) ss += xr[c] * xr[c];
    const float inv = 1.0f / sqrtf(ss * (1.0f / (float)cols) + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) o[c] = xr[c] * inv * w[c];
}

/* hr = xr + dr, nr = rms_norm(hr) * w (hr may alias xr) */
static inline void day0_add_rms_row(float *hr, float *nr, const float *xr, const float *dr, const float *w,
                                    int64_t cols, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < cols; ++c) {
        const float v = xr[c] + dr[c];
        hr[c] = v;
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(ss * (1.0f / (float)cols) + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) nr[c] = hr[c] * inv * w[c];
}

static inline void day0_silu_row(float *o, const float *g, const float *u, int64_t inter) {
    int64_t c = 0;
    for (; c + DAY0_VL <= inter; c += DAY0_VL) {
        day0_vf gv, uv;
        memcpy(&gv, g + c, sizeof gv);
        memcpy(&uv, u + c, sizeof uv);
        const day0_vf ov = gv / (1.0f + day0_expv(-gv)) * uv;
        memcpy(o + c, &ov, sizeof ov);
    }
    for (; c < inter; ++c) o[c] = g[c] / (1.0f + day0_exp1(-g[c])) * u[c];
}

/* rotate-half RoPE of one head in place: pairs (i, i + half), c = the cos row, s = the sin row's second half */
static inline void day0_rotate_head(float *p, const float *c, const float *s, int64_t half) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
        const float a = p[i], b = p[i + half];
        p[i] = a * c[i] - b * s[i];
        p[i + half] = b * c[i] + a * s[i];
    }
}

/* out[o, i, :] = x[o, i, :] * rsqrt(mean(x[o, i, :]^2) + eps) * w   (out contiguous [outer, inner, cols]) */
void day0_rms_norm(float *out, const float *x, const float *w, int64_t outer, int64_t inner, int64_t cols,
                   int64_t x_outer_stride, int64_t x_inner_stride, float eps) {
    const int64_t rows = outer * inner;
#pragma omp parallel for schedule(static) if (rows * cols >= DAY0_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; ++r)
        day0_rms_row(out + r * cols, x + (r / inner) * x_outer_stride + (r % inner) * x_inner_stride, w, cols, eps);
}

/* h = x + d; normed = rms_norm(h) * w   (all [rows, cols] contiguous; h may alias x) */
void day0_add_rms_norm(float *h, float *normed, const float *x, const float *d, const float *w, int64_t rows,
                       int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows * cols >= DAY0_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; ++r)
        day0_add_rms_row(h + r * cols, normed + r * cols, x + r * cols, d + r * cols, w, cols, eps);
}

/* out[r, :] = silu(x[r, :inter]) * x[r, inter:]   (x [rows, 2 * inter], out [rows, inter], contiguous) */
void day0_silu_and_mul(float *out, const float *x, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= DAY0_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; ++r) day0_silu_row(out + r * inter, x + r * 2 * inter, x + r * 2 * inter + inter, inter);
}

/* RoPE in place, rotate-half pairing (i, i + rot/2) on the first `rot` channels of every head:
 * x [tokens, heads, head_dim] with strides (row_stride, head_dim, 1); cos/sin [tokens, 2, rot/2] as the runtime's
 * tables hold them (cos row: (cos, cos); sin row: (-sin, sin)). */
void day0_rotary(float *x, const float *cos_t, const float *sin_t, int64_t tokens, int64_t heads, int64_t head_dim,
                 int64_t row_stride, int64_t rot) {
    const int64_t half = rot / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * rot >= DAY0_PAR_MIN && tokens > 1)
    for (int64_t t = 0; t < tokens; ++t)
        for (int64_t h = 0; h < heads; ++h)
            day0_rotate_head(x + t * row_stride + h * head_dim, cos_t + t * rot, sin_t + t * rot + half, half);
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

#define DAY0_ACC_VECS (DAY0_MAX_HEAD_DIM / DAY0_VL) /* accumulator vectors of one query head */

#if DAY0_VL == 16
/* One chunk of decode attention for GB query heads of a KV group whose head_dim is NV full vectors (the common
 * 64, 128, 256 with 32 registers of 16 lanes): scores s[g][j] = q_g . k_j * scale with the queries held in
 * registers, then (after the online softmax of the caller) acc[g] += s[g][j] * v_j with every accumulator in a
 * register, so each key and value vector is loaded once and feeds GB independent multiply-adds. */
#define DAY0_ATTN_BLOCK(NV, GB)                                                                                  \
    __attribute__((optimize("fp-contract=fast"))) static void day0_qk_##NV##_##GB(                             \
        float (*score)[DAY0_CHUNK], const float *q, const float *const *kp, int64_t n, int64_t gb, int64_t D, \
        float scale) {                                                                                         \
        day0_vf qv[GB][NV];                                                                                    \
        for (int64_t g = 0; g < GB; ++g)                                                                       \
            for (int64_t t = 0; t < NV; ++t) memcpy(&qv[g][t], q + (g < gb ? g : 0) * D + t * 16, 64);         \
        for (int64_t j = 0; j < n; ++j) {                                                                      \
            day0_vf d[GB];                                                                                     \
            for (int64_t g = 0; g < GB; ++g) d[g] = (day0_vf){0};                                              \
            for (int64_t t = 0; t < NV; ++t) {                                                                 \
                day0_vf k;                                                                                     \
                memcpy(&k, kp[j] + t * 16, 64);                                                                \
                for (int64_t g = 0; g < GB; ++g) d[g] += qv[g][t] * k;                                         \
            }                                                                                                  \
            for (int64_t g = 0; g < GB && g < gb; ++g) score[g][j] = day0_hsum(d[g]) * scale;                 \
        }                                                                                                      \
    }                                                                                                          \
    __attribute__((optimize("fp-contract=fast"))) static void day0_pv_##NV##_##GB(                             \
        day0_vf (*acc)[DAY0_ACC_VECS], const float (*score)[DAY0_CHUNK], const float *const *vp, int64_t n,   \
        int64_t gb) {                                                                                          \
        day0_vf a[GB][NV];                                                                                     \
        for (int64_t g = 0; g < GB; ++g)                                                                       \
            for (int64_t t = 0; t < NV; ++t) a[g][t] = acc[g < gb ? g : 0][t];                                 \
        for (int64_t j = 0; j < n; ++j) {                                                                      \
            float p[GB];                                                                                       \
            for (int64_t g = 0; g < GB; ++g) p[g] = g < gb ? score[g][j] : 0.0f;                               \
            for (int64_t t = 0; t < NV; ++t) {                                                                 \
                day0_vf v;                                                                                     \
                memcpy(&v, vp[j] + t * 16, 64);                                                                \
                for (int64_t g = 0; g < GB; ++g) a[g][t] += p[g] * v;                                          \
            }                                                                                                  \
        }                                                                                                      \
        for (int64_t g = 0; g < GB && g < gb; ++g)                                                             \
            for (int64_t t = 0; t < NV; ++t) acc[g][t] = a[g][t];                                              \
    }
DAY0_ATTN_BLOCK(4, 4)
DAY0_ATTN_BLOCK(8, 2)
DAY0_ATTN_BLOCK(16, 1)
#endif

/* The same for any head_dim and vector width: four keys scored at once against three query heads (twelve
 * independent multiply-add chains, the key vectors read from L1 by each head: four chains of one head waited on
 * the multiply-add latency, at a third of the cores' rate), the value vectors added eight at a time into
 * independent accumulators; the last vector of a head may be partial. */
__attribute__((optimize("fp-contract=fast"))) static void day0_qk_any(float (*score)[DAY0_CHUNK], const float *q,
                                                                    const float *const *kp, int64_t n, int64_t gb,
                                                                    int64_t D, float scale) {
    const int64_t nvec = (D + DAY0_VL - 1) / DAY0_VL, last = D - (nvec - 1) * DAY0_VL;
    const int64_t full = last == DAY0_VL ? nvec : nvec - 1;
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
        const int64_t jn = (n - j0) < 4 ? (n - j0) : 4;
        const float *k[4] = {kp[j0], kp[j0 + (jn > 1)], kp[j0 + (jn > 2 ? 2 : 0)], kp[j0 + (jn > 3 ? 3 : 0)]};
        for (int64_t g0 = 0; g0 < gb; g0 += 3) {
            const float *qg[3] = {q + g0 * D, q + (g0 + 1 < gb ? g0 + 1 : g0) * D, q + (g0 + 2 < gb ? g0 + 2 : g0) * D};
            day0_vf d[3][4];
            for (int g = 0; g < 3; ++g)
                for (int i = 0; i < 4; ++i) d[g][i] = (day0_vf){0};
            for (int64_t t = 0; t < full; ++t)
                for (int g = 0; g < 3; ++g) {
                    day0_vf qv;
                    memcpy(&qv, qg[g] + t * DAY0_VL, sizeof qv);
                    for (int i = 0; i < 4; ++i) {
                        day0_vf kv;
                        memcpy(&kv, k[i] + t * DAY0_VL, sizeof kv);
                        d[g][i] += qv * kv;
                    }
                }
            if (full < nvec) {
                const int64_t o = full * DAY0_VL;
                for (int g = 0; g < 3; ++g) {
                    const day0_vf qv = day0_load_n(qg[g] + o, last);
                    for (int i = 0; i < 4; ++i) d[g][i] += qv * day0_load_n(k[i] + o, last);
                }
            }
            for (int g = 0; g < 3 && g0 + g < gb; ++g)
                for (int64_t j = 0; j < jn; ++j) score[g0 + g][j0 + j] = day0_hsum(d[g][j]) * scale;
        }
    }
}

__attribute__((optimize("fp-contract=fast"))) static void day0_pv_any(day0_vf (*acc)[DAY0_ACC_VECS],
                                                                    const float (*score)[DAY0_CHUNK],
                                                                    const float *const *vp, int64_t n, int64_t gb,
                                                                    int64_t D) {
    const int64_t nvec = (D + DAY0_VL - 1) / DAY0_VL, last = D - (nvec - 1) * DAY0_VL;
    const int64_t full = last == DAY0_VL ? nvec : nvec - 1;
    for (int64_t g = 0; g < gb; ++g) {
        int64_t t = 0;
        for (; t + 8 <= full; t += 8) {
            day0_vf a[8];
            for (int v = 0; v < 8; ++v) a[v] = acc[g][t + v];
            for (int64_t j = 0; j < n; ++j) {
                const float p = score[g][j];
                const float *vj = vp[j] + t * DAY0_VL;
                for (int v = 0; v < 8; ++v) {
                    day0_vf b;
                    memcpy(&b, vj + v * DAY0_VL, sizeof b);
                    a[v] += p * b;
                }
            }
            for (int v = 0; v < 8; ++v) acc[g][t + v] = a[v];
        }
        for (; t + 4 <= full; t += 4) {
            day0_vf a[4];
            for (int v = 0; v < 4; ++v) a[v] = acc[g][t + v];
            for (int64_t j = 0; j < n; ++j) {
                const float p = score[g][j];
                const float *vj = vp[j] + t * DAY0_VL;
                for (int v = 0; v < 4; ++v) {
                    day0_vf b;
                    memcpy(&b, vj + v * DAY0_VL, sizeof b);
                    a[v] += p * b;
                }
            }
            for (int v = 0; v < 4; ++v) acc[g][t + v] = a[v];
        }
        for (; t < nvec; ++t) {
            const int64_t w = t < full ? DAY0_VL : last;
            day0_vf a = acc[g][t];
            for (int64_t j = 0; j < n; ++j) a += score[g][j] * day0_load_n(vp[j] + t * DAY0_VL, w);
            acc[g][t] = a;
        }
    }
}

/* Decode attention straight from the paged cache: one query token per sequence, its keys read where they lie
 * (no gather of whole blocks), the query heads of a KV group scored together, an online softmax over chunks
 * of keys. q [B, H, D] with row stride q_stride; caches [blocks, block_size, Hkv, D]; tables [B, width] int32;
 * seqlens [B] int32 (keys of each sequence, its new token included); window > 0: only the last `window` keys.
 * out [B, H, D] contiguous. Returns 0, or -1 when the shape is beyond the kernel's fixed buffers.
 * The head dimension is walked in vectors, blocks of query heads at once (day0_qk_* / day0_pv_*). */
static void day0_decode_attn_for(float *out, const float *q, const float *k_cache, const float *v_cache,
                                 const int32_t *tables, const int32_t *seqlens, int64_t batch, int64_t heads,
                                 int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t width,
                                 int64_t q_stride, float scale, int64_t window) {
    const int64_t group = heads / kv_heads;
    const int64_t token_stride = kv_heads * head_dim; /* between consecutive slots of the cache */
    const int64_t nvec = (head_dim + DAY0_VL - 1) / DAY0_VL;
#if DAY0_VL == 16
    const int64_t gblock = head_dim == 64 ? 4 : head_dim == 128 ? 2 : head_dim == 256 ? 1 : group;
#else
    const int64_t gblock = group;
#endif
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t kh = 0; kh < kv_heads; ++kh) {
            day0_vf acc[DAY0_MAX_GROUP][DAY0_ACC_VECS];
            float score[DAY0_MAX_GROUP][DAY0_CHUNK];
            float run_max[DAY0_MAX_GROUP], run_sum[DAY0_MAX_GROUP];
            const float *qb = q + b * q_stride + kh * group * head_dim;
            const int32_t *table = tables + b * width;
            const int64_t len = seqlens[b];
            const int64_t start = (window > 0 && len > window) ? len - window : 0;
            for (int64_t g = 0; g < group; ++g) {
                run_max[g] = -INFINITY;
                run_sum[g] = 0.0f;
                for (int64_t t = 0; t < nvec; ++t) acc[g][t] = (day0_vf){0};
            }
            for (int64_t t0 = start; t0 < len; t0 += DAY0_CHUNK) {
                const int64_t n = (len - t0) < DAY0_CHUNK ? (len - t0) : DAY0_CHUNK;
                const float *kp[DAY0_CHUNK], *vp[DAY0_CHUNK];
                int64_t blk = t0 / block_size, off = t0 % block_size; /* walked, not divided, per key */
                for (int64_t j = 0; j < n; ++j) {
                    const int64_t slot = (int64_t)table[blk] * block_size + off;
                    kp[j] = k_cache + slot * token_stride + kh * head_dim;
                    vp[j] = v_cache + slot * token_stride + kh * head_dim;
                    if (++off == block_size) {
                        off = 0;
                        ++blk;
                    }
                }
                /* the next chunk's keys requested now, while this one is computed: they lie in blocks scattered
                 * over the pool, whose starts the hardware prefetchers cannot guess. 24 sequences of ~400 keys on
                 * an AVX2 Zen 4: 3.3 -> 2.0 ms a layer (16 of ~160: 0.8 -> 0.57); the values too, or every line of
                 * the keys into L1, or two chunks ahead, measured no better */
                const int64_t n2 = len - t0 - n < DAY0_CHUNK ? len - t0 - n : DAY0_CHUNK;
                for (int64_t j = 0; j < n2; ++j) {
                    const int64_t slot = (int64_t)table[blk] * block_size + off;
                    const char *kn = (const char *)(k_cache + slot * token_stride + kh * head_dim);
                    for (int64_t b = 0; b < head_dim * (int64_t)sizeof(float); b += 64) __builtin_prefetch(kn + b, 0, 1);
                    if (++off == block_size) {
                        off = 0;
                        ++blk;
                    }
                }
                for (int64_t g0 = 0; g0 < group; g0 += gblock) {
                    const int64_t gb = (group - g0) < gblock ? (group - g0) : gblock;
                    const float *qg = qb + g0 * head_dim;
#if DAY0_VL == 16
                    if (head_dim == 64) day0_qk_4_4(score + g0, qg, kp, n, gb, head_dim, scale);
                    else if (head_dim == 128) day0_qk_8_2(score + g0, qg, kp, n, gb, head_dim, scale);
                    else if (head_dim == 256) day0_qk_16_1(score + g0, qg, kp, n, gb, head_dim, scale);
                    else
#endif
                        day0_qk_any(score + g0, qg, kp, n, gb, head_dim, scale);
                }
                for (int64_t g = 0; g < group; ++g) { /* the chunk's softmax terms, DAY0_CHUNK / DAY0_VL vectors */
                    float *sg = score[g];
                    for (int64_t j = n; j < DAY0_CHUNK; ++j) sg[j] = -INFINITY;
                    day0_vf s[DAY0_CHUNK / DAY0_VL];
                    memcpy(s, sg, sizeof s);
                    day0_vf m = s[0];
                    for (int i = 1; i < DAY0_CHUNK / DAY0_VL; ++i)
                        m = (day0_vf)(((day0_vi)m & (m > s[i])) | ((day0_vi)s[i] & ~(m > s[i])));
                    float chunk_max = m[0];
                    for (int i = 1; i < DAY0_VL; ++i) chunk_max = m[i] > chunk_max ? m[i] : chunk_max;
                    const float new_max = chunk_max > run_max[g] ? chunk_max : run_max[g];
                    const float correction = day0_exp1(run_max[g] - new_max); /* ~0 on the first chunk */
                    day0_vi lane;
                    for (int i = 0; i < DAY0_VL; ++i) lane[i] = i;
                    day0_vf total = {0};
                    for (int i = 0; i < DAY0_CHUNK / DAY0_VL; ++i) { /* exactly 0 past n */
                        s[i] = (day0_vf)((day0_vi)day0_expv(s[i] - new_max) & (lane + i * DAY0_VL < (int32_t)n));
                        total += s[i];
                    }
                    memcpy(sg, s, sizeof s);
                    const float sum = day0_hsum(total);
                    run_sum[g] = run_sum[g] * correction + sum;
                    run_max[g] = new_max;
                    if (correction != 1.0f)
                        for (int64_t t = 0; t < nvec; ++t) acc[g][t] *= correction;
                }
                for (int64_t g0 = 0; g0 < group; g0 += gblock) {
                    const int64_t gb = (group - g0) < gblock ? (group - g0) : gblock;
                    const float (*sc)[DAY0_CHUNK] = (const float (*)[DAY0_CHUNK])(score + g0);
#if DAY0_VL == 16
                    if (head_dim == 64) day0_pv_4_4(acc + g0, sc, vp, n, gb);
                    else if (head_dim == 128) day0_pv_8_2(acc + g0, sc, vp, n, gb);
                    else if (head_dim == 256) day0_pv_16_1(acc + g0, sc, vp, n, gb);
                    else
#endif
                        day0_pv_any(acc + g0, sc, vp, n, gb, head_dim);
                }
            }
            for (int64_t g = 0; g < group; ++g) {
                float *o = out + (b * heads + kh * group + g) * head_dim;
                const float inv = run_sum[g] > 0.0f ? 1.0f / run_sum[g] : 0.0f;
                for (int64_t t = 0; t < nvec; ++t) {
                    const day0_vf v = acc[g][t] * inv;
                    memcpy(o + t * DAY0_VL, &v, sizeof(float) * (t + 1 < nvec ? DAY0_VL : head_dim - t * DAY0_VL));
                }
            }
        }
    }
}

int day0_paged_decode_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                                const int32_t *tables, const int32_t *seqlens, int64_t batch, int64_t heads,
                                int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t width,
                                int64_t q_stride, float scale, int64_t window) {
    const int64_t group = heads / kv_heads;
    if (head_dim > DAY0_MAX_HEAD_DIM || group > DAY0_MAX_GROUP || group * kv_heads != heads) return -1;
    int64_t keys = 0;
    for (int64_t b = 0; b < batch; ++b) keys += seqlens[b];
#pragma omp parallel if (keys * heads * head_dim >= DAY0_PAR_MIN)
    day0_decode_attn_for(out, q, k_cache, v_cache, tables, seqlens, batch, heads, kv_heads, head_dim, block_size,
                         width, q_stride, scale, window);
    return 0;
}

/* ---- prefill attention over the paged cache -------------------------------------------------------------------
 * Every prompt (or prompt chunk) of a batch in one call: causal attention of each sequence's q_len new queries over
 * its k_len cached keys (its new ones included: they are stored before the call), the new queries the last q_len
 * positions; window > 0: a query sees only the last `window` keys up to its own. Work items are (sequence, KV
 * head, tile of queries): the query heads of a KV group and DAY0_AT_ROWS / group consecutive queries share each
 * key they read. A chunk of DAY0_AT_KC keys is gathered from the cache transposed ([D][KC], so that 2 vectors of
 * scores are one register tile's multiply-adds over d with the query broadcast), scored against the item's rows,
 * masked, folded into each row's online softmax, and its values added into the rows' accumulators (2 vectors of
 * d at a time, the probabilities broadcast). Tiles hold DAY0_AT_MR rows: 6 with AVX2's 16 registers, 14 with
 * AVX-512's 32 (12 + 2 and 28 + 2 of them). Longest items first, dynamically over the threads.
 * q [T, H, D] (token stride q_stride, heads contiguous); caches [blocks, block_size, Hkv, D]; per sequence i of n:
 * q_start[i] (its first row of q and out), q_len[i], k_len[i] (>= q_len) and its row of tables [., width] (int32
 * block ids). out [T, H * D] (rows of other sequences untouched). head_dim a multiple of the vector width, at most
 * DAY0_MAX_HEAD_DIM. kt_all: scratch of kt_floats floats, at least Hkv * D * DAY0_AT_KC per chunk of DAY0_AT_KC keys of
 * every sequence with new queries. Returns 0, -1 for a shape the kernel does not take, -2 when out of memory, -3
 * when kt_all is too small. */

#define DAY0_AT_KB (2 * DAY0_VL)                        /* keys of one score tile */
#define DAY0_AT_MR ((DAY0_NREGS - 3) / 2)              /* rows of a tile */
#define DAY0_AT_KC (4 * DAY0_AT_KB)                     /* keys per chunk of the online softmax */
#define DAY0_AT_ROWS (((96 + DAY0_AT_MR - 1) / DAY0_AT_MR) * DAY0_AT_MR) /* rows (queries x heads) of an item */

/* s[i][0 .. 2 VL) = sum over d of qt[d][i] * kt[d][0 .. 2 VL), i < MR (row stride of s: DAY0_AT_KC) */
__attribute__((optimize("fp-contract=fast"))) static void day0_at_qk(float *s, const float *qt, const float *kt,
                                                                   int64_t D) {
    day0_vf a0[DAY0_AT_MR], a1[DAY0_AT_MR];
    for (int i = 0; i < DAY0_AT_MR; ++i) a0[i] = a1[i] = (day0_vf){0};
    for (int64_t d = 0; d < D; ++d) {
        day0_vf k0, k1;
        memcpy(&k0, kt + d * DAY0_AT_KC, sizeof k0);
        memcpy(&k1, kt + d * DAY0_AT_KC + DAY0_VL, sizeof k1);
        for (int i = 0; i < DAY0_AT_MR; ++i) {
            const float qi = qt[d * DAY0_AT_MR + i];
            a0[i] += qi * k0;
            a1[i] += qi * k1;
        }
    }
    for (int i = 0; i < DAY0_AT_MR; ++i) {
        memcpy(s + i * DAY0_AT_KC, &a0[i], sizeof a0[i]);
        memcpy(s + i * DAY0_AT_KC + DAY0_VL, &a1[i], sizeof a1[i]);
    }
}

/* o[i][0 .. NV VL) += sum over j < n of p[i][j] * v_j[0 .. NV VL), i < MR (o row stride ldo; p row stride KC) */
#define DAY0_AT_PV(NV)                                                                                         \
    __attribute__((optimize("fp-contract=fast"))) static void day0_at_pv##NV(                                 \
        float *o, int64_t ldo, const float *p, const float *const *vp, int64_t off, int64_t n) {              \
        day0_vf a[DAY0_AT_MR][NV];                                                                             \
        for (int i = 0; i < DAY0_AT_MR; ++i)                                                                   \
            for (int v = 0; v < NV; ++v) memcpy(&a[i][v], o + i * ldo + v * DAY0_VL, sizeof a[i][v]);          \
        for (int64_t j = 0; j < n; ++j) {                                                                      \
            day0_vf w[NV];                                                                                     \
            for (int v = 0; v < NV; ++v) memcpy(&w[v], vp[j] + off + v * DAY0_VL, sizeof w[v]);               \
            for (int i = 0; i < DAY0_AT_MR; ++i) {                                                             \
                const float pi = p[i * DAY0_AT_KC + j];                                                        \
                for (int v = 0; v < NV; ++v) a[i][v] += pi * w[v];                                             \
            }                                                                                                  \
        }                                                                                                      \
        for (int i = 0; i < DAY0_AT_MR; ++i)                                                                   \
            for (int v = 0; v < NV; ++v) memcpy(o + i * ldo + v * DAY0_VL, &a[i][v], sizeof a[i][v]);          \
    }
DAY0_AT_PV(1)
DAY0_AT_PV(2)

static _Thread_local const int64_t *day0_sort_cost; /* the costs qsort's comparator reads (this thread's call) */

static int day0_by_cost_desc(const void *a, const void *b) {
    const int64_t ca = day0_sort_cost[*(const int64_t *)a], cb = day0_sort_cost[*(const int64_t *)b];
    if (ca != cb) return ca < cb ? 1 : -1;
    return *(const int64_t *)a < *(const int64_t *)b ? -1 : *(const int64_t *)a > *(const int64_t *)b;
}

int day0_prefill_key_chunk(void) { return DAY0_AT_KC; }

int day0_paged_prefill_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                                 const int32_t *tables, const int32_t *q_start, const int32_t *q_len,
                                 const int32_t *k_len, int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 int64_t block_size, int64_t width, int64_t q_stride, float scale, int64_t window,
                                 float *kt_all, int64_t kt_floats) {
    const int64_t D = head_dim, G = heads / kv_heads;
    if (D > DAY0_MAX_HEAD_DIM || D % DAY0_VL || G > DAY0_MAX_GROUP || G * kv_heads != heads || block_size < 1)
        return -1;
    const int64_t qt_rows = G >= DAY0_AT_ROWS ? 1 : DAY0_AT_ROWS / G; /* queries per item */
    const int64_t rows_max = ((qt_rows * G + DAY0_AT_MR - 1) / DAY0_AT_MR) * DAY0_AT_MR;
    /* items (sequence, query tile, KV head), the costliest first (a tile's cost: about its last query's keys); and
     * each sequence's first chunk of keys in kt_all, where every key is transposed once for all its items */
    int64_t n_items = 0, n_chunks = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (q_len[i] < 0 || k_len[i] < q_len[i]) return -1;
        n_items += kv_heads * ((q_len[i] + qt_rows - 1) / qt_rows);
        if (q_len[i] > 0) n_chunks += (k_len[i] + DAY0_AT_KC - 1) / DAY0_AT_KC;
    }
    if (n_items == 0) return 0;
    if (n_chunks * kv_heads * D * DAY0_AT_KC > kt_floats) return -3;
    int64_t *items = malloc(sizeof(int64_t) * (5 * n_items + n + 2 * n_chunks));
    if (!items) return -2;
    int64_t *cost = items + 3 * n_items, *perm = cost + n_items, *chunk0 = perm + n_items,
            *chunk_seq = chunk0 + n, *chunk_idx = chunk_seq + n_chunks;
    int64_t m = 0, c = 0;
    for (int64_t i = 0; i < n; ++i) {
        chunk0[i] = c;
        if (q_len[i] > 0)
            for (int64_t j = 0; j * DAY0_AT_KC < k_len[i]; ++j, ++c) {
                chunk_seq[c] = i;
                chunk_idx[c] = j;
            }
        for (int64_t t = 0; t * qt_rows < q_len[i]; ++t)
            for (int64_t kh = 0; kh < kv_heads; ++kh, ++m) {
                const int64_t end = k_len[i] - q_len[i] + (t + 1) * qt_rows;
                const int64_t last = end < k_len[i] ? end : k_len[i];
                items[3 * m] = i;
                items[3 * m + 1] = t;
                items[3 * m + 2] = kh;
                cost[m] = window > 0 && last > window ? window : last;
            }
    }
    /* costliest first: (cost, item) pairs sorted by qsort (an insertion sort was quadratic in the items: 2048
     * one-token sequences x 8 KV heads a step) */
    for (int64_t a = 0; a < n_items; ++a) perm[a] = a;
    day0_sort_cost = cost;
    qsort(perm, (size_t)n_items, sizeof(int64_t), day0_by_cost_desc);
    int failed = 0;
    const int64_t token_stride = kv_heads * D, chunk_floats = D * DAY0_AT_KC;
    int64_t total = 0;
    for (int64_t a = 0; a < n_items; ++a) total += cost[a];
#pragma omp parallel if (total * rows_max * D >= DAY0_PAR_MIN)
    {
        /* every chunk of keys of a sequence with new queries, transposed: kt_all[chunk][kh][D][KC], zero past the
         * last key */
#pragma omp for schedule(static)
        for (int64_t ck = 0; ck < n_chunks * kv_heads; ++ck) {
            const int64_t cc = ck / kv_heads, kh = ck % kv_heads, s = chunk_seq[cc], j0 = chunk_idx[cc] * DAY0_AT_KC;
            const int64_t nk = k_len[s] - j0 < DAY0_AT_KC ? k_len[s] - j0 : DAY0_AT_KC;
            float *kt = kt_all + ck * chunk_floats;
            const int32_t *table = tables + s * width;
            int64_t blk = j0 / block_size, off = j0 % block_size;
            for (int64_t j = 0; j < nk; ++j) {
                const float *src = k_cache + ((int64_t)table[blk] * block_size + off) * token_stride + kh * D;
                for (int64_t d = 0; d < D; ++d) kt[d * DAY0_AT_KC + j] = src[d];
                if (++off == block_size) {
                    off = 0;
                    ++blk;
                }
            }
            for (int64_t d = 0; d < D && nk < DAY0_AT_KC; ++d)
                memset(kt + d * DAY0_AT_KC + nk, 0, sizeof(float) * (DAY0_AT_KC - nk));
        }
        /* per thread: the rows' queries re-laid [tile][D][MR] and pre-scaled, scores [rows][KC], accumulators
         * [rows][D] */
        const size_t floats = (size_t)(2 * rows_max * D + rows_max * DAY0_AT_KC + 15) / 16 * 16;
        float *qt = aligned_alloc(64, sizeof(float) * floats);
        if (!qt) {
#pragma omp atomic write
            failed = 1;
        }
        float *sc = qt ? qt + rows_max * D : 0, *acc = sc ? sc + rows_max * DAY0_AT_KC : 0;
        float run_max[DAY0_AT_ROWS], run_sum[DAY0_AT_ROWS];
        int64_t row_hi[DAY0_AT_ROWS], row_lo[DAY0_AT_ROWS];
        const float *vp[DAY0_AT_KC];
        day0_vi lane;
        for (int l = 0; l < DAY0_VL; ++l) lane[l] = l;
#pragma omp for schedule(dynamic, 1)
        for (int64_t a = 0; a < n_items; ++a) {
            if (!qt) continue;
            const int64_t it = perm[a], s = items[3 * it], kh = items[3 * it + 2];
            const int64_t i0 = items[3 * it + 1] * qt_rows;
            const int64_t nq = q_len[s] - i0 < qt_rows ? q_len[s] - i0 : qt_rows;
            const int64_t R = nq * G, tiles = (R + DAY0_AT_MR - 1) / DAY0_AT_MR, Rp = tiles * DAY0_AT_MR;
            const int64_t first_pos = k_len[s] - q_len[s] + i0; /* the absolute position of the item's first query */
            const int32_t *table = tables + s * width;
            for (int64_t r = 0; r < Rp; ++r) { /* row r: query r / G, head kh * G + r % G */
                float *dst = qt + (r / DAY0_AT_MR) * D * DAY0_AT_MR + r % DAY0_AT_MR;
                if (r < R) {
                    const float *src = q + (q_start[s] + i0 + r / G) * q_stride + (kh * G + r % G) * D;
                    for (int64_t d = 0; d < D; ++d) dst[d * DAY0_AT_MR] = src[d] * scale;
                    row_hi[r] = first_pos + r / G; /* keys row_lo..row_hi */
                    row_lo[r] = window > 0 ? row_hi[r] - window + 1 : 0;
                } else {
                    for (int64_t d = 0; d < D; ++d) dst[d * DAY0_AT_MR] = 0.0f;
                    row_hi[r] = -1;
                    row_lo[r] = 0;
                }
                run_max[r] = -INFINITY;
                run_sum[r] = 0.0f;
                memset(acc + r * D, 0, sizeof(float) * D);
            }
            const int64_t k_end = first_pos + nq; /* keys [k_begin, k_end), in whole chunks */
            int64_t k_begin = window > 0 ? first_pos - window + 1 : 0;
            k_begin = k_begin < 0 ? 0 : k_begin / DAY0_AT_KC * DAY0_AT_KC;
            for (int64_t j0 = k_begin; j0 < k_end; j0 += DAY0_AT_KC) {
                const int64_t nk = k_end - j0 < DAY0_AT_KC ? k_end - j0 : DAY0_AT_KC;
                int64_t blk = j0 / block_size, off = j0 % block_size;
                for (int64_t j = 0; j < nk; ++j) {
                    vp[j] = v_cache + ((int64_t)table[blk] * block_size + off) * token_stride + kh * D;
                    if (++off == block_size) {
                        off = 0;
                        ++blk;
                    }
                }
                const float *kt = kt_all + ((chunk0[s] + j0 / DAY0_AT_KC) * kv_heads + kh) * chunk_floats;
                const int64_t kb = (nk + DAY0_AT_KB - 1) / DAY0_AT_KB, width_v = kb * DAY0_AT_KB / DAY0_VL;
                for (int64_t t = 0; t < tiles; ++t)
                    for (int64_t b = 0; b < kb; ++b)
                        day0_at_qk(sc + t * DAY0_AT_MR * DAY0_AT_KC + b * DAY0_AT_KB, qt + t * D * DAY0_AT_MR,
                                   kt + b * DAY0_AT_KB, D);
                for (int64_t r = 0; r < Rp; ++r) { /* mask, then this chunk's softmax terms */
                    float *sr = sc + r * DAY0_AT_KC;
                    int64_t lo = row_lo[r] - j0, hi = row_hi[r] - j0 + 1; /* keys of the chunk row r sees */
                    lo = lo < 0 ? 0 : lo;
                    hi = hi > nk ? nk : hi;
                    if (hi <= lo) {
                        memset(sr, 0, sizeof(float) * width_v * DAY0_VL);
                        continue;
                    }
                    const day0_vf ninf = (day0_vf){0} - INFINITY;
                    day0_vf mv = ninf;
                    for (int64_t v = 0; v < width_v; ++v) {
                        day0_vf x;
                        memcpy(&x, sr + v * DAY0_VL, sizeof x);
                        const day0_vi j = lane + (int32_t)(v * DAY0_VL);
                        const day0_vi in = (j >= (int32_t)lo) & (j < (int32_t)hi);
                        x = (day0_vf)(((day0_vi)x & in) | ((day0_vi)ninf & ~in));
                        memcpy(sr + v * DAY0_VL, &x, sizeof x);
                        mv = (day0_vf)(((day0_vi)mv & (mv > x)) | ((day0_vi)x & ~(mv > x)));
                    }
                    float mx = mv[0];
                    for (int l = 1; l < DAY0_VL; ++l) mx = mv[l] > mx ? mv[l] : mx;
                    const float new_max = mx > run_max[r] ? mx : run_max[r];
                    const float corr = run_max[r] == -INFINITY ? 0.0f : day0_exp1(run_max[r] - new_max);
                    day0_vf tot = {0};
                    for (int64_t v = 0; v < width_v; ++v) { /* exactly 0 where masked */
                        day0_vf x;
                        memcpy(&x, sr + v * DAY0_VL, sizeof x);
                        x = (day0_vf)((day0_vi)day0_expv(x - new_max) & (x > ninf));
                        tot += x;
                        memcpy(sr + v * DAY0_VL, &x, sizeof x);
                    }
                    run_sum[r] = run_sum[r] * corr + day0_hsum(tot);
                    run_max[r] = new_max;
                    if (corr != 1.0f)
                        for (int64_t d = 0; d < D; d += DAY0_VL) {
                            day0_vf o;
                            memcpy(&o, acc + r * D + d, sizeof o);
                            o *= corr;
                            memcpy(acc + r * D + d, &o, sizeof o);
                        }
                }
                for (int64_t t = 0; t < tiles; ++t) {
                    float *o = acc + t * DAY0_AT_MR * D;
                    const float *p = sc + t * DAY0_AT_MR * DAY0_AT_KC;
                    int64_t d0 = 0;
                    for (; d0 + 2 * DAY0_VL <= D; d0 += 2 * DAY0_VL) day0_at_pv2(o + d0, D, p, vp, d0, nk);
                    if (d0 < D) day0_at_pv1(o + d0, D, p, vp, d0, nk);
                }
            }
            for (int64_t r = 0; r < R; ++r) {
                float *dst = out + (q_start[s] + i0 + r / G) * heads * D + (kh * G + r % G) * D;
                const float inv = run_sum[r] > 0.0f ? 1.0f / run_sum[r] : 0.0f;
                for (int64_t d = 0; d < D; ++d) dst[d] = acc[r * D + d] * inv;
            }
        }
        free(qt);
    }
    free(items);
    return failed ? -2 : 0;
}

/* The first index of each row's maximum (torch.argmax's tie rule); -1 for a row that holds a NaN, which the
 * caller hands to torch (whose argmax picks the NaN). x [rows, cols] contiguous, out [rows]. */
void day0_argmax_rows(int64_t *out, const float *x, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= 4 * DAY0_PAR_MIN && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const float *p = x + r * cols;
        float m = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
        for (int64_t c = 0; c < cols; ++c) {
            m = p[c] > m ? p[c] : m;
            nan |= p[c] != p[c];
        }
        if (nan || cols == 0) {
            out[r] = -1;
            continue;
        }
        int64_t i = 0;
        while (p[i] != m) ++i;
        out[r] = i;
    }
}

/* ---- routed experts: few-row matrix products straight from each expert's row-major weights ------------------
 * y[m, n] = x[m, :] . w[n, :] in dot-product form: the weights stay in their checkpoint layout ([N, K], K
 * contiguous), each is read once per block of DAY0_MR rows, and DAY0_NR weight rows are scored against DAY0_MR
 * input rows at once (16 vector accumulators), so both sides' loads are shared. At decode an expert gets a
 * handful of rows: torch's CPU grouped GEMM runs one unpacked matrix product per expert there at a fraction of
 * the machine's rate (dense layers have oneDNN's packed weights instead, which this does not beat). */

#if DAY0_NREGS >= 32
#define DAY0_MR 4 /* 16 accumulators, 8 operands */
#else
#define DAY0_MR 2 /* 8 accumulators, 6 operands: 16 registers */
#endif
#define DAY0_NR 4

/* rows x[0..m) (pointers), weight rows w[n0..n1) (row stride ldw), K columns; y[r][n - y_off] for each row r.
 * Multiply-adds are fused here (one rounding per term, like the GEMM libraries), and only here. */
__attribute__((optimize("fp-contract=fast"))) static void day0_dot_block(float *const *y, int64_t y_off,
                                                                       const float *const *x, int64_t m,
                                                                       const float *w, int64_t ldw, int64_t n0,
                                                                       int64_t n1, int64_t K) {
    const int64_t kv = K - K % DAY0_VL;
    for (int64_t n = n0; n < n1; n += DAY0_NR) {
        const int64_t nr = (n1 - n) < DAY0_NR ? (n1 - n) : DAY0_NR;
        const float *wr[DAY0_NR];
        #pragma GCC unroll 8
        for (int64_t j = 0; j < DAY0_NR; ++j) wr[j] = w + (n + (j < nr ? j : 0)) * ldw;
        for (int64_t r0 = 0; r0 < m; r0 += DAY0_MR) {
            const int64_t mr = (m - r0) < DAY0_MR ? (m - r0) : DAY0_MR;
            const float *xr[DAY0_MR];
            #pragma GCC unroll 8
            for (int64_t i = 0; i < DAY0_MR; ++i) xr[i] = x[r0 + (i < mr ? i : 0)];
            day0_vf acc[DAY0_MR][DAY0_NR];
            #pragma GCC unroll 8
            for (int64_t i = 0; i < DAY0_MR; ++i)
                for (int64_t j = 0; j < DAY0_NR; ++j) acc[i][j] = (day0_vf){0};
            for (int64_t k = 0; k < kv; k += DAY0_VL) {
                day0_vf wv[DAY0_NR], xv[DAY0_MR];
                /* weight rows two blocks ahead, a line at a time: they come from memory */
                if (r0 == 0 && n + 2 * DAY0_NR < n1 && (k * (int64_t)sizeof(float)) % 64 == 0)
                    #pragma GCC unroll 8
                    for (int64_t j = 0; j < DAY0_NR; ++j) __builtin_prefetch(wr[j] + 2 * DAY0_NR * ldw + k, 0, 3);
                #pragma GCC unroll 8
                for (int64_t j = 0; j < DAY0_NR; ++j) memcpy(&wv[j], wr[j] + k, sizeof(day0_vf));
                #pragma GCC unroll 8
                for (int64_t i = 0; i < DAY0_MR; ++i) memcpy(&xv[i], xr[i] + k, sizeof(day0_vf));
#if defined(__x86_64__) && defined(__AVX512F__)
                /* each loaded once into a register: gcc otherwise folds the loads into every multiply-add, 5
                 * loads per 4 of them, and the loop then runs at the load ports' pace */
                #pragma GCC unroll 8
                for (int64_t i = 0; i < DAY0_MR; ++i) __asm__("" : "+v"(xv[i]));
                #pragma GCC unroll 8
                for (int64_t j = 0; j < DAY0_NR; ++j) __asm__("" : "+v"(wv[j]));
#elif defined(__x86_64__) && defined(__AVX__)
                #pragma GCC unroll 8
                for (int64_t i = 0; i < DAY0_MR; ++i) __asm__("" : "+x"(xv[i]));
                #pragma GCC unroll 8
                for (int64_t j = 0; j < DAY0_NR; ++j) __asm__("" : "+x"(wv[j]));
#endif
                #pragma GCC unroll 8
                for (int64_t i = 0; i < DAY0_MR; ++i)
                    for (int64_t j = 0; j < DAY0_NR; ++j) acc[i][j] += xv[i] * wv[j];
            }
            for (int64_t i = 0; i < mr; ++i) {
                for (int64_t j = 0; j < nr; ++j) {
                    float s = day0_hsum(acc[i][j]);
                    for (int64_t k = kv; k < K; ++k) s += xr[i][k] * wr[j][k];
                    y[r0 + i][n + j - y_off] = s;
                }
            }
        }
    }
}

/* The routing of P (token, choice) pairs over E experts: offs [E + 1] each expert's first sorted row, order [P]
 * the pair of each sorted row and row_of [P] its inverse (a stable counting sort: each expert's rows in token
 * order), active the experts with rows. Returns how many are active, or -1 for an id out of range. */
static int64_t day0_moe_route(const int64_t *ids, int64_t P, int64_t E, int64_t *offs, int64_t *order,
                              int64_t *row_of, int64_t *active) {
    for (int64_t e = 0; e <= E; ++e) offs[e] = 0;
    for (int64_t p = 0; p < P; ++p) {
        if (ids[p] < 0 || ids[p] >= E) return -1;
        offs[ids[p] + 1] += 1;
    }
    for (int64_t e = 0; e < E; ++e) offs[e + 1] += offs[e];
    int64_t n_active = 0;
    for (int64_t e = 0; e < E; ++e)
        if (offs[e + 1] > offs[e]) active[n_active++] = e;
    int64_t fill[E > 0 ? E : 1];
    for (int64_t e = 0; e < E; ++e) fill[e] = offs[e];
    for (int64_t p = 0; p < P; ++p) {
        const int64_t r = fill[ids[p]]++;
        order[r] = p;
        row_of[p] = r;
    }
    return n_active;
}

/* out[t] = the sum over token t's k choices, in ascending sorted row (= expert) order, of topw * ys[row]; a
 * worksharing loop of the enclosing parallel region */
static void day0_moe_combine(float *out, const float *ys, const int64_t *row_of, const float *topw, int64_t T,
                             int64_t k, int64_t H) {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        float *o = out + t * H;
        for (int64_t c = 0; c < H; ++c) o[c] = 0.0f;
        int64_t done = 0, last = -1; /* choices added so far */
        while (done < k) {
            int64_t best = -1;
            for (int64_t j = 0; j < k; ++j) {
                const int64_t r = row_of[t * k + j];
                if (r > last && (best < 0 || r < row_of[t * k + best])) best = j;
            }
            const int64_t r = row_of[t * k + best];
            const float wgt = topw[t * k + best];
            const float *yr = ys + r * H;
#pragma omp simd
            for (int64_t c = 0; c < H; ++c) o[c] += yr[c] * wgt;
            last = r;
            ++done;
        }
    }
}

#define DAY0_NB 32 /* weight rows per work item: 96 KiB of a 768-wide fp32 matrix, a few microseconds */

/* Routed SwiGLU experts of T tokens, every expert local and whole:
 *   out[t] = sum over the token's k choices, in ascending expert order, of
 *            topw[t, j] * w2[e] @ (silu(w13[e][:I] @ x[t]) * (w13[e][I:] @ x[t]))      with e = ids[t, j]
 * x [T, H], w13 [E, 2I, H], w2 [E, H, I], ids [T, k] int64, topw [T, k] fp32, out [T, H]; all contiguous.
 * scratch: T*k*(I + H) floats. Each expert's weights are read once for all of its rows, and the work items
 * (an expert and a block of its weight rows) are spread over the threads with no expert loop in Python and no
 * host synchronisation. Returns 0, or -1 for an expert id out of range. */
int day0_moe_experts(float *out, const float *x, const float *w13, const float *w2, const int64_t *ids,
                     const float *topw, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I, float *scratch,
                     int64_t *work) {
    const int64_t P = T * k; /* (token, choice) pairs */
    /* work: counts/offsets [E + 1], pair order [P], active experts [E], row of each pair [P] */
    int64_t *offs = work, *order = work + E + 1, *active = order + P, *row_of = active + E;
    const int64_t n_active = day0_moe_route(ids, P, E, offs, order, row_of, active);
    if (n_active < 0) return -1;
    float *act = scratch, *ys = scratch + P * I; /* act [P, I], ys [P, H], rows in sorted order */
    const int64_t gate_blocks = (I + DAY0_NB - 1) / DAY0_NB, down_blocks = (H + DAY0_NB - 1) / DAY0_NB;
#pragma omp parallel
    {
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t a = 0; a < n_active; ++a) {
            for (int64_t b = 0; b < gate_blocks; ++b) {
                const int64_t e = active[a], r0 = offs[e], m = offs[e + 1] - r0;
                const int64_t n0 = b * DAY0_NB, n1 = (n0 + DAY0_NB) < I ? (n0 + DAY0_NB) : I, nb = n1 - n0;
                const float *we = w13 + e * 2 * I * H;
                for (int64_t c = 0; c < m; c += 64) {
                    const int64_t mc = (m - c) < 64 ? (m - c) : 64;
                    const float *xp[64];
                    float gate[64][DAY0_NB], up[64][DAY0_NB];
                    float *gp[64], *upp[64];
                    for (int64_t i = 0; i < mc; ++i) {
                        xp[i] = x + (order[r0 + c + i] / k) * H;
                        gp[i] = gate[i];
                        upp[i] = up[i];
                    }
                    day0_dot_block(gp, n0, xp, mc, we, H, n0, n1, H);
                    day0_dot_block(upp, I + n0, xp, mc, we, H, I + n0, I + n1, H);
                    for (int64_t i = 0; i < mc; ++i) {
                        float *o = act + (r0 + c + i) * I + n0;
                        for (int64_t j = 0; j < nb; j += DAY0_VL) {
                            const int64_t n = (nb - j) < DAY0_VL ? (nb - j) : DAY0_VL;
                            day0_vf g = {0}, u = {0};
                            memcpy(&g, gate[i] + j, sizeof(float) * n);
                            memcpy(&u, up[i] + j, sizeof(float) * n);
                            const day0_vf v = g / (1.0f + day0_expv(-g)) * u;
                            memcpy(o + j, &v, sizeof(float) * n);
                        }
                    }
                }
            }
        }
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t a = 0; a < n_active; ++a) {
            for (int64_t b = 0; b < down_blocks; ++b) {
                const int64_t e = active[a], r0 = offs[e], m = offs[e + 1] - r0;
                const int64_t n0 = b * DAY0_NB, n1 = (n0 + DAY0_NB) < H ? (n0 + DAY0_NB) : H;
                const float *we = w2 + e * H * I;
                for (int64_t c = 0; c < m; c += 64) {
                    const int64_t mc = (m - c) < 64 ? (m - c) : 64;
                    const float *xp[64];
                    float *yp[64];
                    for (int64_t i = 0; i < mc; ++i) {
                        xp[i] = act + (r0 + c + i) * I;
                        yp[i] = ys + (r0 + c + i) * H;
                    }
                    day0_dot_block(yp, 0, xp, mc, we, I, n0, n1, I);
                }
            }
        }
        day0_moe_combine(out, ys, row_of, topw, T, k, H);
    }
    return 0;
}

/* ---- dense linears over panel-packed weights -------------------------------------------------------------------
 * y[m, n] = x[m, :] . W[n, :] (+ bias[n]) with W [N, K] stored as panels: wp[p][k][c] = W[16 p + c][k] (N padded
 * to a multiple of 16 with zero rows), so one panel is a single contiguous stream of K vectors of 16 outputs.
 * A tile of up to DAY0_TILE_ROWS rows (16 with AVX-512, 6 with AVX2) keeps a panel row's worth of accumulator
 * vectors per row (one of 16 lanes, two of 8) and adds x[m, k] * wp[p][k][:] for k = 0, 1, ...
 * in order: each output is one fused multiply-add chain over k, whatever the row count, tile or thread count
 * (so a row's result never depends on what it is batched with). At decode a thread streams its panels once at
 * the machine's read rate (a row-major or oneDNN-blocked weight is read 1.5-2x slower at 1-2 rows on these
 * shapes); with 16 rows each weight vector feeds 16 multiply-adds whose other operand is broadcast from the
 * re-laid rows, and past 16 rows the panel (K * 64 bytes, L2-resident) is reused by every tile: 91-100 % of
 * oneDNN's blocked GEMM at 128-2048 rows on a 2-core Zen 4 (2048-wide K the lowest). Blocking K (panel slices
 * kept in L1) measured slower at every block size from 64 to 1024. */

#define DAY0_PANEL 16
#define DAY0_X_BLOCK_BYTES (512 * 1024) /* re-laid rows of x per block: half a Zen 4 / Xeon core's L2 */
/* vectors of one panel row, and the rows a tile can hold in registers with a panel row beside them: 16 with
 * AVX-512 (16 + 1 of 32 registers), 6 with AVX2 (12 + 2 of 16) */
#define DAY0_PV (DAY0_PANEL / DAY0_VL)
#define DAY0_TILE_FIT ((DAY0_NREGS - DAY0_PV - 1) / DAY0_PV)
#define DAY0_TILE_ROWS (DAY0_TILE_FIT < DAY0_PANEL ? DAY0_TILE_FIT : DAY0_PANEL)
#define DAY0_PANEL_TILE(MR)                                                                                    \
    __attribute__((optimize("fp-contract=fast"))) static void day0_panel_tile_##MR(                          \
        float *y, int64_t ldy, const float *x, int64_t xk, const float *wp, int64_t K, int64_t cols,          \
        const float *pf) {                                                                                     \
        day0_vf acc[MR][DAY0_PV];                                                                              \
        for (int i = 0; i < MR; ++i)                                                                           \
            for (int v = 0; v < DAY0_PV; ++v) acc[i][v] = (day0_vf){0};                                        \
        for (int64_t k = 0; k < K; ++k) {                                                                      \
            day0_vf w[DAY0_PV];                                                                                \
            if (pf) __builtin_prefetch(pf + k * DAY0_PANEL, 0, 2);                                             \
            for (int v = 0; v < DAY0_PV; ++v) memcpy(&w[v], wp + k * DAY0_PANEL + v * DAY0_VL, sizeof w[v]);   \
            for (int i = 0; i < MR; ++i) {                                                                     \
                const float xi = x[k * xk + i];                                                                \
                for (int v = 0; v < DAY0_PV; ++v) acc[i][v] += xi * w[v];                                      \
            }                                                                                                  \
        }                                                                                                      \
        for (int i = 0; i < MR; ++i) /* whole vectors' stores inlined: a sized call per row cost ~10 % */     \
            for (int v = 0; v < DAY0_PV; ++v) {                                                                \
                const int64_t left = cols - v * DAY0_VL;                                                       \
                const day0_vf a = acc[i][v];                                                                   \
                if (left >= DAY0_VL) memcpy(y + i * ldy + v * DAY0_VL, &a, sizeof a);                          \
                else if (left > 0) memcpy(y + i * ldy + v * DAY0_VL, &a, sizeof(float) * left);                \
            }                                                                                                  \
    }
DAY0_PANEL_TILE(1) DAY0_PANEL_TILE(2) DAY0_PANEL_TILE(3) DAY0_PANEL_TILE(4) DAY0_PANEL_TILE(5) DAY0_PANEL_TILE(6)
DAY0_PANEL_TILE(7) DAY0_PANEL_TILE(8) DAY0_PANEL_TILE(9) DAY0_PANEL_TILE(10) DAY0_PANEL_TILE(11)
DAY0_PANEL_TILE(12) DAY0_PANEL_TILE(13) DAY0_PANEL_TILE(14) DAY0_PANEL_TILE(15) DAY0_PANEL_TILE(16)

typedef void (*day0_panel_tile_fn)(float *, int64_t, const float *, int64_t, const float *, int64_t, int64_t,
                                   const float *);
static const day0_panel_tile_fn day0_panel_tiles[DAY0_PANEL + 1] = {
    0, day0_panel_tile_1, day0_panel_tile_2, day0_panel_tile_3, day0_panel_tile_4, day0_panel_tile_5,
    day0_panel_tile_6, day0_panel_tile_7, day0_panel_tile_8, day0_panel_tile_9, day0_panel_tile_10,
    day0_panel_tile_11, day0_panel_tile_12, day0_panel_tile_13, day0_panel_tile_14, day0_panel_tile_15,
    day0_panel_tile_16};

/* W [N, K] (row stride ldw) -> wp [ceil(N / 16), K, 16], the padding rows zero. */
void day0_pack_panels(float *wp, const float *w, int64_t N, int64_t K, int64_t ldw) {
    const int64_t panels = (N + DAY0_PANEL - 1) / DAY0_PANEL;
#pragma omp parallel for schedule(static) if (N * K >= DAY0_PAR_MIN)
    for (int64_t p = 0; p < panels; ++p) {
        float *dst = wp + p * K * DAY0_PANEL;
        for (int64_t c = 0; c < DAY0_PANEL; ++c) {
            const int64_t n = p * DAY0_PANEL + c;
            for (int64_t k = 0; k < K; ++k) dst[k * DAY0_PANEL + c] = n < N ? w[n * ldw + k] : 0.0f;
        }
    }
}

/* Rows of x go in tiles of DAY0_XR, as many as a tile holds in registers; for more than one row x is re-laid as
 * [tile][k][DAY0_XR], so a tile's broadcasts at one k are DAY0_XR contiguous floats and nothing else (6-row
 * tiles over 16-row groups, with AVX2, read 2.7x the bytes they used: 85-107 -> 113-164 GF at 128 rows). */
#define DAY0_XR DAY0_TILE_ROWS

/* y [M, N] (row stride ldy) = x [M, K] (row stride ldx) times the panels wp (see above), plus bias [N] unless
 * NULL. xp: scratch of ceil(M / DAY0_XR) * DAY0_XR * K floats (at most (M + 15) K; unused for one row). */
/* The work of day0_panel_linear as orphaned worksharing: run by the team of the enclosing parallel region (or
 * alone), without the closing barrier (the panels' loop is nowait): a caller inside a region adds one before y is
 * read. */
static void day0_panel_for(float *y, const float *x, const float *wp, const float *bias, int64_t M, int64_t N,
                           int64_t K, int64_t ldx, int64_t ldy, float *xp) {
    const int64_t panels = (N + DAY0_PANEL - 1) / DAY0_PANEL, tiles = (M + DAY0_XR - 1) / DAY0_XR;
    if (M > 1) {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t mr = M - t * DAY0_XR < DAY0_XR ? M - t * DAY0_XR : DAY0_XR;
            float *dst = xp + t * DAY0_XR * K;
            const float *src = x + t * DAY0_XR * ldx;
            for (int64_t k = 0; k < K; ++k) /* written in order, read from mr rows at once */
                for (int64_t i = 0; i < mr; ++i) dst[k * DAY0_XR + i] = src[i * ldx + k];
        }
    }
    const float *xs = M > 1 ? xp : x;
    const int64_t xk = M > 1 ? DAY0_XR : 1, xt = M > 1 ? DAY0_XR * K : 0;
    /* rows in blocks whose re-laid x (rows * K floats) stays in L2 while the thread's panels go over it: x is
     * then fetched from L3 once, and each panel once per block (a 2048 x 2048 activation re-read for every
     * panel of a down projection cost 20 %) */
    const int64_t fit = (DAY0_X_BLOCK_BYTES / (int64_t)sizeof(float) / (K > 0 ? K : 1)) / DAY0_XR * DAY0_XR;
    const int64_t block = M <= DAY0_XR ? DAY0_XR : (fit > DAY0_XR ? fit : DAY0_XR);
    for (int64_t m0 = 0; m0 < M; m0 += block) {
        const int64_t m1 = m0 + block < M ? m0 + block : M;
        const int64_t t0 = m0 / DAY0_XR, t1 = (m1 + DAY0_XR - 1) / DAY0_XR;
        /* the same static split of the panels in every block: a thread's panels are one contiguous run of the
         * weight, and its blocks need no barrier between them */
#pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; ++p) {
            const int64_t n0 = p * DAY0_PANEL, cols = N - n0 < DAY0_PANEL ? N - n0 : DAY0_PANEL;
            const float *w = wp + p * K * DAY0_PANEL;
            /* the next panel is fetched while the first tile works this one (the later tiles find it in L1/L2;
             * at one row the stream alone is the work): 2-16 rows ran 1.2-2x faster on a 2-core Zen 4, whose
             * hardware prefetch did not keep up with one stream per core at ~12 multiply-adds per line */
            const float *next = M > 1 && p + 1 < panels ? w + K * DAY0_PANEL : 0;
            for (int64_t t = t0; t < t1; ++t) {
                const int64_t mr = M - t * DAY0_XR < DAY0_XR ? M - t * DAY0_XR : DAY0_XR;
                day0_panel_tiles[mr](y + t * DAY0_XR * ldy + n0, ldy, xs + t * xt, xk, w, K, cols,
                                     t == t0 ? next : 0);
            }
            if (bias)
                for (int64_t m = m0; m < m1; ++m)
                    for (int64_t c = 0; c < cols; ++c) y[m * ldy + n0 + c] += bias[n0 + c];
        }
    }
}

void day0_panel_linear(float *y, const float *x, const float *wp, const float *bias, int64_t M, int64_t N,
                       int64_t K, int64_t ldx, int64_t ldy, float *xp) {
    const int64_t panels = (N + DAY0_PANEL - 1) / DAY0_PANEL;
#pragma omp parallel if (M * N * K >= 8 * DAY0_PAR_MIN && panels > 1)
    day0_panel_for(y, x, wp, bias, M, N, K, ldx, ldy, xp);
}

/* Each active expert's tiles tile0[e]..tile0[e + 1] cut into segments of at most `step` tiles, written as
 * (expert, first tile, end tile) triples; returns how many. */
static int64_t day0_moe_segments(int64_t *segs, const int64_t *active, int64_t n_active, const int64_t *tile0,
                                 int64_t step) {
    int64_t n = 0;
    for (int64_t a = 0; a < n_active; ++a) {
        const int64_t e = active[a], end = tile0[e + 1];
        for (int64_t s0 = tile0[e]; s0 < end; s0 += step, ++n) {
            segs[3 * n] = e;
            segs[3 * n + 1] = s0;
            segs[3 * n + 2] = s0 + step < end ? s0 + step : end;
        }
    }
    return n;
}

/* W [N, K] as panels in place of the experts' stacked weights (day0_moe_panels): each expert's gate rows, then
 * its up rows, each padded to whole panels, and its down projection:
 *   w13p [E][2 GP][H][16] (GP = ceil(I / 16); panels 0..GP-1 the gate rows, GP..2GP-1 the up rows)
 *   w2p  [E][HP][I][16]   (HP = ceil(H / 16)) */

/* Routed SwiGLU experts of T tokens over panel-packed weights, every expert local and whole: the same sum as
 * day0_moe_experts (each token's k terms added in ascending expert order), but every product is a panel tile's
 * multiply-add chain over k in order, so a token's result does not depend on what it is batched with, and the
 * weights stream at the panels' rate at any row count (decode: 1-16 rows an expert; prefill: hundreds).
 * Each expert's rows are re-laid once as [tile][H][16] (its tiles padded apart), gate and up run as pairs of
 * panels whose SiLU product is written straight into the re-laid layout the down projection reads, and the work
 * items (an expert and one of its panels) are spread over the threads.
 * scratch: R * (H + I) + T * k * H floats with R = T * k + 15 * E; work: 10 E + 9 T k + 3 int64s.
 * Returns 0, or -1 for an expert id out of range. */
int day0_moe_panels(float *out, const float *x, const float *w13p, const float *w2p, const int64_t *ids,
                    const float *topw, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I, float *scratch,
                    int64_t *work) {
    const int64_t P = T * k, GP = (I + DAY0_PANEL - 1) / DAY0_PANEL, HP = (H + DAY0_PANEL - 1) / DAY0_PANEL;
    /* work: counts/offsets [E + 1], pair order [P], active experts [E], row of each pair [P], first tile of each
     * expert [E + 1], expert of each tile [P + E], then two lists of segments (expert, first tile, end tile), one
     * per projection, [3 (P + E)] each */
    int64_t *offs = work, *order = offs + E + 1, *active = order + P, *row_of = active + E, *tile0 = row_of + P,
            *tile_e = tile0 + E + 1, *segs13 = tile_e + P + E, *segs2 = segs13 + 3 * (P + E);
    const int64_t n_active = day0_moe_route(ids, P, E, offs, order, row_of, active);
    if (n_active < 0) return -1;
    tile0[0] = 0;
    for (int64_t e = 0; e < E; ++e) {
        const int64_t m = offs[e + 1] - offs[e], tiles = (m + DAY0_PANEL - 1) / DAY0_PANEL;
        for (int64_t t = 0; t < tiles; ++t) tile_e[tile0[e] + t] = e;
        tile0[e + 1] = tile0[e] + tiles;
    }
    const int64_t n_tiles = tile0[E];
    /* an expert's tiles in segments whose re-laid rows (16 K floats a tile) stay in L2 while the panels of a run of
     * work items go over them (2048 prefill tokens: 512 rows an expert, 1.5 MiB of them, were re-read from L3 for
     * every panel) */
    const int64_t fit13 = DAY0_X_BLOCK_BYTES / (DAY0_PANEL * (int64_t)sizeof(float) * H),
                  fit2 = DAY0_X_BLOCK_BYTES / (DAY0_PANEL * (int64_t)sizeof(float) * (I > 0 ? I : 1));
    const int64_t n13 = day0_moe_segments(segs13, active, n_active, tile0, fit13 > 1 ? fit13 : 1);
    const int64_t n2 = day0_moe_segments(segs2, active, n_active, tile0, fit2 > 1 ? fit2 : 1);
    /* xs [tiles][H][16]: each expert's rows re-laid; acts [tiles][I][16]: their SiLU(gate) * up, re-laid the same
     * way; ys [P][H]: each sorted row's down projection */
    float *xs = scratch, *acts = xs + n_tiles * DAY0_PANEL * H, *ys = acts + n_tiles * DAY0_PANEL * I;
#pragma omp parallel if (P * H * I >= DAY0_PAR_MIN)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n_tiles; ++t) {
            const int64_t e = tile_e[t], r0 = offs[e] + (t - tile0[e]) * DAY0_PANEL;
            const int64_t mr = offs[e + 1] - r0 < DAY0_PANEL ? offs[e + 1] - r0 : DAY0_PANEL;
            const float *src[DAY0_PANEL];
            for (int64_t i = 0; i < mr; ++i) src[i] = x + (order[r0 + i] / k) * H;
            float *dst = xs + t * DAY0_PANEL * H;
            for (int64_t c = 0; c < H; ++c)
                for (int64_t i = 0; i < mr; ++i) dst[c * DAY0_PANEL + i] = src[i][c];
        }
#pragma omp for collapse(2) schedule(dynamic, 4) /* runs of 4 panels: the next one prefetched */
        for (int64_t sg = 0; sg < n13; ++sg) {
            for (int64_t j = 0; j < GP; ++j) {
                const int64_t e = segs13[3 * sg], ta = segs13[3 * sg + 1], tb = segs13[3 * sg + 2];
                const int64_t m = offs[e + 1] - offs[e];
                const int64_t cols = I - j * DAY0_PANEL < DAY0_PANEL ? I - j * DAY0_PANEL : DAY0_PANEL;
                const float *wg = w13p + (e * 2 * GP + j) * H * DAY0_PANEL, *wu = wg + GP * H * DAY0_PANEL;
                const float *next = j + 1 < GP ? wg + H * DAY0_PANEL : 0;
                for (int64_t t = ta; t < tb; ++t) {
                    const int64_t rows = m - (t - tile0[e]) * DAY0_PANEL;
                    const int64_t mr = rows < DAY0_PANEL ? rows : DAY0_PANEL;
                    const float *xt = xs + t * DAY0_PANEL * H;
                    float *at = acts + t * DAY0_PANEL * I + j * DAY0_PANEL * DAY0_PANEL;
                    float gate[DAY0_PANEL][DAY0_PANEL], up[DAY0_PANEL][DAY0_PANEL];
                    for (int64_t i0 = 0; i0 < mr; i0 += DAY0_TILE_ROWS) {
                        const int64_t r = mr - i0 < DAY0_TILE_ROWS ? mr - i0 : DAY0_TILE_ROWS;
                        const int first = t == ta;
                        day0_panel_tiles[r](gate[i0], DAY0_PANEL, xt + i0, DAY0_PANEL, wg, H, DAY0_PANEL,
                                            first ? wu : 0);
                        day0_panel_tiles[r](up[i0], DAY0_PANEL, xt + i0, DAY0_PANEL, wu, H, DAY0_PANEL,
                                            first ? next : 0);
                    }
                    for (int64_t i = 0; i < mr; ++i) {
                        float v[DAY0_PANEL];
                        for (int64_t c = 0; c < DAY0_PANEL; c += DAY0_VL) {
                            day0_vf g, u;
                            memcpy(&g, gate[i] + c, sizeof g);
                            memcpy(&u, up[i] + c, sizeof u);
                            const day0_vf s = g / (1.0f + day0_expv(-g)) * u;
                            memcpy(v + c, &s, sizeof s);
                        }
                        for (int64_t c = 0; c < cols; ++c) at[c * DAY0_PANEL + i] = v[c]; /* [tile][I][16] */
                    }
                }
            }
        }
#pragma omp for collapse(2) schedule(dynamic, 4) /* runs of 4 panels: the next one prefetched */
        for (int64_t sg = 0; sg < n2; ++sg) {
            for (int64_t p = 0; p < HP; ++p) {
                const int64_t e = segs2[3 * sg], ta = segs2[3 * sg + 1], tb = segs2[3 * sg + 2];
                const int64_t m = offs[e + 1] - offs[e];
                const int64_t n0 = p * DAY0_PANEL, cols = H - n0 < DAY0_PANEL ? H - n0 : DAY0_PANEL;
                const float *w = w2p + (e * HP + p) * I * DAY0_PANEL;
                const float *next = p + 1 < HP ? w + I * DAY0_PANEL : 0;
                for (int64_t t = ta; t < tb; ++t) {
                    const int64_t rows = m - (t - tile0[e]) * DAY0_PANEL;
                    const int64_t mr = rows < DAY0_PANEL ? rows : DAY0_PANEL;
                    const int64_t r0 = offs[e] + (t - tile0[e]) * DAY0_PANEL;
                    const float *at = acts + t * DAY0_PANEL * I;
                    for (int64_t i0 = 0; i0 < mr; i0 += DAY0_TILE_ROWS) {
                        const int64_t r = mr - i0 < DAY0_TILE_ROWS ? mr - i0 : DAY0_TILE_ROWS;
                        day0_panel_tiles[r](ys + (r0 + i0) * H + n0, H, at + i0, DAY0_PANEL, w, I, cols,
                                            t == ta ? next : 0);
                    }
                }
            }
        }
        day0_moe_combine(out, ys, row_of, topw, T, k, H);
    }
    return 0;
}

/* ---- decode layers in one call --------------------------------------------------------------------------------
 * A decode step (one new token per sequence) through a run of decoder layers in one parallel region: the same
 * work, in the same order and by the same code, as the layers' separate kernels (rms norm, QKV panels, QK-norm,
 * RoPE, the cache write, paged decode attention, O panels, residual add + norm, gate/up panels, SiLU-and-mul,
 * down panels), so every value is the one the separate calls give; what goes is a parallel region, a Python
 * module call and a result tensor per op (~75 of them a token in a small model, ~15 % of its step). The stages
 * are separated by barriers. One layer's weights and cache, as the runtime lays them out: */
struct day0_layer {
    const float *in_norm, *post_norm; /* [hidden] RMSNorm weights */
    const float *qkv, *qkv_bias;      /* panels of W_qkv [(H + 2 Hkv) D, hidden]; bias or NULL */
    const float *q_norm, *k_norm;     /* [D] per-head RMSNorm weights (QK-norm), or NULL */
    const float *o, *o_bias;          /* panels of W_o [hidden, H D]; bias or NULL */
    float *k_cache, *v_cache;         /* [blocks, block_size, Hkv, D] */
    const float *gate_up, *down;      /* panels of W_gu [2 I, hidden] and W_d [hidden, I]; NULL: no MLP here */
    int64_t heads, kv_heads, head_dim, rot, inter, window;
    float in_eps, post_eps, qk_eps, scale;
};

/* x [B, hidden]: the residual stream, updated in place; delta [B, hidden]: the previous layer's MLP output, still
 * to be added (has_delta), and this run's last MLP output on return when its last layer has one. normed [B,
 * hidden]: on return, the post-attention norm of the last layer's stream when that layer has no MLP here (the
 * caller runs it: routed experts). cos/sin: the step's rotary tables ([B, 2, rot/2] each, RotaryEmbedding's
 * layout); slots [B] the cache slots of the new tokens; tables [B, width] and seqlens [B] as for
 * day0_paged_decode_attention. scratch: day0_decode_scratch floats. Returns 0, or -1 for a shape the kernels do not
 * take (checked
 * before anything is written), or a layer without an MLP that is not the run's last. */
/* The largest per-layer sizes of a run (QKV row, attention row, intermediate size, inner dimension of a
 * product): -1 for a layer the kernels do not take, or a layer without an MLP that is not the run's last. */
static int day0_run_sizes(const struct day0_layer *layers, int64_t n_layers, int64_t hidden, int64_t sizes[4]) {
    sizes[0] = sizes[1] = sizes[2] = 0;
    sizes[3] = hidden;
    for (int64_t l = 0; l < n_layers; ++l) {
        const struct day0_layer *L = &layers[l];
        const int64_t group = L->kv_heads > 0 ? L->heads / L->kv_heads : 0;
        if (L->head_dim > DAY0_MAX_HEAD_DIM || group < 1 || group > DAY0_MAX_GROUP || group * L->kv_heads != L->heads
            || L->rot % 2 || L->rot > L->head_dim || (!L->gate_up && l + 1 < n_layers))
            return -1;
        const int64_t qkv = (L->heads + 2 * L->kv_heads) * L->head_dim, attn = L->heads * L->head_dim;
        sizes[0] = qkv > sizes[0] ? qkv : sizes[0];
        sizes[1] = attn > sizes[1] ? attn : sizes[1];
        sizes[2] = L->inter > sizes[2] ? L->inter : sizes[2];
        sizes[3] = attn > sizes[3] ? attn : sizes[3];
        sizes[3] = L->inter > sizes[3] ? L->inter : sizes[3];
    }
    return 0;
}

/* Floats of scratch day0_decode_layers needs for this run at B rows (its layout below); -1 as day0_run_sizes. */
int64_t day0_decode_scratch(const struct day0_layer *layers, int64_t n_layers, int64_t hidden, int64_t B) {
    int64_t z[4];
    if (day0_run_sizes(layers, n_layers, hidden, z)) return -1;
    return B * (z[0] + z[1] + hidden + (2 * z[2] > hidden ? 2 * z[2] : hidden) + z[2]) + (B + DAY0_PANEL - 1) * z[3];
}

int day0_decode_layers(float *x, float *delta, int64_t has_delta, float *normed_out, const struct day0_layer *layers,
                       int64_t n_layers, int64_t B, int64_t hidden, const float *cos_t, const float *sin_t,
                       const int64_t *slots, const int32_t *tables, const int32_t *seqlens, int64_t block_size,
                       int64_t width, float *scratch) {
    int64_t z[4];
    if (day0_run_sizes(layers, n_layers, hidden, z)) return -1;
    const int64_t qkv_max = z[0], attn_max = z[1], inter_max = z[2];
    float *qkv_buf = scratch, *attn_buf = qkv_buf + B * qkv_max, *normed = attn_buf + B * attn_max;
    float *proj = normed + B * hidden; /* the O projection's output, then gate/up ([B, 2 I]) */
    float *act = proj + B * (2 * inter_max > hidden ? 2 * inter_max : hidden);
    float *xp = act + B * inter_max; /* the panels' re-laid rows: (B + 15) * z[3] floats */
#pragma omp parallel
    {
        int64_t pending = has_delta;
        for (int64_t l = 0; l < n_layers; ++l) {
            const struct day0_layer *L = &layers[l];
            const int64_t H = L->heads, Hkv = L->kv_heads, D = L->head_dim, half = L->rot / 2;
            const int64_t row = (H + 2 * Hkv) * D, token_stride = Hkv * D;
            /* the input norm (with the pending residual add) */
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; ++b) {
                if (pending)
                    day0_add_rms_row(x + b * hidden, normed + b * hidden, x + b * hidden, delta + b * hidden,
                                     L->in_norm, hidden, L->in_eps);
                else
                    day0_rms_row(normed + b * hidden, x + b * hidden, L->in_norm, hidden, L->in_eps);
            }
            day0_panel_for(qkv_buf, normed, L->qkv, L->qkv_bias, B, row, hidden, hidden, row, xp);
#pragma omp barrier
            /* QK-norm, RoPE on q and k, the new k and v into the cache: one item per (token, head) */
#pragma omp for schedule(static)
            for (int64_t item = 0; item < B * (H + 2 * Hkv); ++item) {
                const int64_t b = item / (H + 2 * Hkv), h = item % (H + 2 * Hkv);
                float *p = qkv_buf + b * row + h * D;
                if (h < H + Hkv) {
                    const float *nw = h < H ? L->q_norm : L->k_norm;
                    if (nw) day0_rms_row(p, p, nw, D, L->qk_eps);
                    if (half) day0_rotate_head(p, cos_t + b * L->rot, sin_t + b * L->rot + half, half);
                }
                if (h >= H) {
                    float *cache = h < H + Hkv ? L->k_cache : L->v_cache;
                    const int64_t kh = h < H + Hkv ? h - H : h - H - Hkv;
                    memcpy(cache + slots[b] * token_stride + kh * D, p, sizeof(float) * D);
                }
            }
            day0_decode_attn_for(attn_buf, qkv_buf, L->k_cache, L->v_cache, tables, seqlens, B, H, Hkv, D, block_size,
                                 width, row, L->scale, L->window);
            day0_panel_for(proj, attn_buf, L->o, L->o_bias, B, hidden, H * D, H * D, hidden, xp);
#pragma omp barrier
            /* the residual add and the post-attention norm */
            float *post = L->gate_up ? normed : normed_out;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; ++b)
                day0_add_rms_row(x + b * hidden, post + b * hidden, x + b * hidden, proj + b * hidden, L->post_norm,
                                 hidden, L->post_eps);
            if (!L->gate_up) { /* the caller runs this layer's MLP (the run ends here) */
                pending = 0;
                continue;
            }
            const int64_t I = L->inter;
            day0_panel_for(proj, normed, L->gate_up, 0, B, 2 * I, hidden, hidden, 2 * I, xp);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; ++b) day0_silu_row(act + b * I, proj + b * 2 * I, proj + b * 2 * I + I, I);
            day0_panel_for(delta, act, L->down, 0, B, hidden, I, I, hidden, xp);
#pragma omp barrier
            pending = 1;
        }
    }
    return 0;
}
