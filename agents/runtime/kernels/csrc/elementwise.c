/* Row kernels: RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE in place, greedy argmax. The row helpers
 * (day0_rms_row ...) are shared with the fused decode layers (decode_layers.c). */

#include "day0_internal.h"

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
