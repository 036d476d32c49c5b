/* Routed SwiGLU experts over panel-packed weights. */

#include "day0_internal.h"

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
