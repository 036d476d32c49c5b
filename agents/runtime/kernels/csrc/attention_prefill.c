/* Prefill attention of a whole batch of prompts and chunks over the paged KV cache. */

#include "day0_internal.h"

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
