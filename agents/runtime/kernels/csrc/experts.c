/* Routed SwiGLU experts from each expert's row-major weights; the routing and combine helpers are shared with
 * the panel-packed experts (expert_panels.c). */

#include "day0_internal.h"

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
