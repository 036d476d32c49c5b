/* Dense linears over panel-packed weights. */

#include "day0_internal.h"

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
