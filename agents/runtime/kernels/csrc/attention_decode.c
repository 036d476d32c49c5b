/* Decode attention straight from the paged KV cache. */

#include "day0_internal.h"

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
