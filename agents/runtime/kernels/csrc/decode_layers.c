/* A decode step through a run of whole decoder layers in one call. */

#include "day0_internal.h"

/* ---- decode layers in one call --------------------------------------------------------------------------------
 * A decode step (one new token per sequence) through a run of decoder layers in one parallel region: the same
 * work, in the same order and by the same code, as the layers' separate kernels (rms norm, QKV panels, QK-norm,
 * RoPE, the cache write, paged decode attention, O panels, residual add + norm, gate/up panels, SiLU-and-mul,
 * down panels; on a tensor-parallel rank the all-reduce of the O and down projections' partial sums), so every
 * value is the one the separate calls give; what goes is a parallel region, a Python module call and a result
 * tensor per op (~75 of them a token in a small model, ~15 % of its step). The stages
 * are separated by barriers. A layer's weights and cache: struct day0_layer
 * (day0_kernels.h). */

/* x [B, hidden]: the residual stream, updated in place; delta [B, hidden]: the previous layer's MLP output, still
 * to be added (has_delta), and this run's last MLP output on return when its last layer has one. normed [B,
 * hidden]: on return, the post-attention norm of the last layer's stream when that layer has no MLP here (the
 * caller runs it: routed experts). cos/sin: the step's rotary tables ([B, 2, rot/2] each, RotaryEmbedding's
 * layout); slots [B] the cache slots of the new tokens; tables [B, width] and seqlens [B] as for
 * day0_paged_decode_attention. scratch: day0_decode_scratch floats.
 *
 * comm: NULL on one rank. On a tensor-parallel rank the layers are its shards (its heads of QKV and O, its slice
 * of gate/up and down) and the O and down projections give partial sums: each is summed over the ranks right
 * there by the shared-memory all-reduce (day0_team_allreduce: one thread publishes and waits, the team adds the
 * slots in rank order), then the O bias is added, as RowParallelLinear does (all_reduce, then + bias) -- the same
 * collectives, in the same order and pieces, as the layers' own forwards make, so a rank may take either path
 * on any step. Returns 0, -1 for a shape the kernels do not take (checked before anything is written), or a
 * layer without an MLP that is not the run's last, or a collective's failure (DAY0_COMM_*, day0_kernels.h). */
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
                       int64_t width, float *scratch, struct day0_comm *comm) {
    int64_t z[4];
    if (day0_run_sizes(layers, n_layers, hidden, z)) return -1;
    const int64_t qkv_max = z[0], attn_max = z[1], inter_max = z[2];
    float *qkv_buf = scratch, *attn_buf = qkv_buf + B * qkv_max, *normed = attn_buf + B * attn_max;
    float *proj = normed + B * hidden; /* the O projection's output, then gate/up ([B, 2 I]) */
    float *act = proj + B * (2 * inter_max > hidden ? 2 * inter_max : hidden);
    float *xp = act + B * inter_max; /* the panels' re-laid rows: (B + 15) * z[3] floats */
    int comm_rc = 0; /* a collective's failure: the same on every thread of the team, which then stops */
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
            day0_panel_for(proj, attn_buf, L->o, comm ? 0 : L->o_bias, B, hidden, H * D, H * D, hidden, xp);
#pragma omp barrier
            if (comm && day0_team_allreduce(proj, B * hidden, comm, &comm_rc)) break;
            /* (the O bias after the sum) the residual add and the post-attention norm */
            float *post = L->gate_up ? normed : normed_out;
            const float *late_bias = comm ? L->o_bias : 0;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; ++b) {
                if (late_bias)
                    for (int64_t c = 0; c < hidden; ++c) proj[b * hidden + c] += late_bias[c];
                day0_add_rms_row(x + b * hidden, post + b * hidden, x + b * hidden, proj + b * hidden, L->post_norm,
                                 hidden, L->post_eps);
            }
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
            if (comm && day0_team_allreduce(delta, B * hidden, comm, &comm_rc)) break;
            pending = 1;
        }
    }
    return comm_rc;
}
