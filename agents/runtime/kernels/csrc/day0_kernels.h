/* The runtime's fused fp32 CPU kernels: what the Python side binds with ctypes (agents/runtime/kernels/abi.py
 * mirrors every signature and struct here). Change a signature or struct and DAY0_ABI_VERSION goes up with the
 * mirror; the loader refuses a library whose version or struct sizes differ from its mirror. */
#ifndef DAY0_KERNELS_H
#define DAY0_KERNELS_H

#include <stdint.h>

#define DAY0_ABI_VERSION 10
#define DAY0_MAX_HEAD_DIM 512
#define DAY0_MAX_GROUP 32

/* One decoder layer as day0_decode_layers reads it: its weights (panels) and caches, as the runtime lays them out. */
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

/* The shared-memory all-reduce of the ranks of one host as day0_decode_layers runs it on a tensor-parallel rank
 * (after the row-parallel O and down projections): the segment agents/runtime/distributed/shm_allreduce.py made,
 * this rank's place in it and its sequence number, which each call advances (the Python side takes it back). */
struct day0_comm {
    char *seg;                 /* the segment's address in this process */
    const int64_t *pids;       /* [world] every rank's process id: a peer whose process ended fails the wait */
    int64_t rank, world, slot; /* slot: floats a rank publishes per call (larger tensors go in pieces) */
    int64_t seq;               /* the last sequence number used (in and out) */
    double poll_s, timeout_s;  /* how often a wait checks the peers' processes; how long it may last in all */
    int64_t failed;            /* out: the rank found gone (DAY0_COMM_GONE) */
    int64_t calls;             /* out, added to: the all-reduces done */
    double wait_s;             /* out, added to: seconds spent publishing and waiting in them (the adding not counted) */
};

/* day0_decode_layers' results past -1 (a shape refused): a collective failed mid-run, the stream is partly written */
#define DAY0_COMM_ABANDONED (-2) /* a rank set the segment's abort line (its step failed) */
#define DAY0_COMM_GONE (-3)      /* the process of rank comm->failed ended */
#define DAY0_COMM_TIMEOUT (-4)   /* a rank did not arrive within comm->timeout_s */

/* the structs the Python side mirrors, by the index day0_struct_size takes */
enum day0_struct { DAY0_STRUCT_LAYER = 0, DAY0_STRUCT_COMM = 1, DAY0_STRUCT_COUNT };

/* abi.c: what the loader checks before it binds anything */
int day0_abi_version(void);
int64_t day0_struct_size(int which); /* sizeof the struct, -1 for an index past DAY0_STRUCT_COUNT */
const char *day0_source_digest(void); /* the digest of the sources the library was built from */
int day0_cpu_supported(void);         /* 1 when this CPU has the instruction sets the build was compiled for */
int day0_vector_width(void);

/* threads.c */
int day0_bind_threads(const int *cpus, int n);

/* shm_allreduce.c: the all-reduce of x [n] in place through comm (its seq advanced); 0 or DAY0_COMM_* */
int day0_shm_allreduce(float *x, int64_t n, struct day0_comm *comm);

/* elementwise.c */
void day0_rms_norm(float *out, const float *x, const float *w, int64_t outer, int64_t inner, int64_t cols,
                   int64_t x_outer_stride, int64_t x_inner_stride, float eps);
void day0_add_rms_norm(float *h, float *normed, const float *x, const float *d, const float *w, int64_t rows,
                       int64_t cols, float eps);
void day0_silu_and_mul(float *out, const float *x, int64_t rows, int64_t inter);
void day0_rotary(float *x, const float *cos_t, const float *sin_t, int64_t tokens, int64_t heads, int64_t head_dim,
                 int64_t row_stride, int64_t rot);
void day0_argmax_rows(int64_t *out, const float *x, int64_t rows, int64_t cols);

/* attention_decode.c */
int day0_paged_decode_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                                const int32_t *tables, const int32_t *seqlens, int64_t batch, int64_t heads,
                                int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t width,
                                int64_t q_stride, float scale, int64_t window);

/* attention_prefill.c */
int day0_prefill_key_chunk(void);
int day0_paged_prefill_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                                 const int32_t *tables, const int32_t *q_start, const int32_t *q_len,
                                 const int32_t *k_len, int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 int64_t block_size, int64_t width, int64_t q_stride, float scale, int64_t window,
                                 float *kt_all, int64_t kt_floats);

/* experts.c */
int day0_moe_experts(float *out, const float *x, const float *w13, const float *w2, const int64_t *ids,
                     const float *topw, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I, float *scratch,
                     int64_t *work);

/* panels.c */
void day0_pack_panels(float *wp, const float *w, int64_t N, int64_t K, int64_t ldw);
void day0_panel_linear(float *y, const float *x, const float *wp, const float *bias, int64_t M, int64_t N,
                       int64_t K, int64_t ldx, int64_t ldy, float *xp);

/* expert_panels.c */
int day0_moe_panels(float *out, const float *x, const float *w13p, const float *w2p, const int64_t *ids,
                    const float *topw, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I, float *scratch,
                    int64_t *work);

/* decode_layers.c */
int64_t day0_decode_scratch(const struct day0_layer *layers, int64_t n_layers, int64_t hidden, int64_t B);
int day0_decode_layers(float *x, float *delta, int64_t has_delta, float *normed_out, const struct day0_layer *layers,
                       int64_t n_layers, int64_t B, int64_t hidden, const float *cos_t, const float *sin_t,
                       const int64_t *slots, const int32_t *tables, const int32_t *seqlens, int64_t block_size,
                       int64_t width, float *scratch, struct day0_comm *comm);

#endif
