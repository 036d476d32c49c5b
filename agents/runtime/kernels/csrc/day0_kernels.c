/* Fused fp32 CPU kernels of the runtime's decoder step (agents/runtime/kernels/build.py compiles this file once per
 * source, compiler and CPU; the layers fall back to their torch code where it is not loaded).
 *
 * Each kernel replaces a chain of small torch ops with one call: at decode a layer's work is tiny and the step
 * was spending more time dispatching ops (and copying whole KV blocks for attention) than computing. The loops
 * are written so that gcc -O3 -march=native vectorises them; OpenMP is the same runtime torch uses (libgomp is
 * already loaded by torch under the same soname), so torch.set_num_threads() governs both.
 *
 * One build unit: the op families' files are included here and compiled as one translation unit, so the fused
 * decode layers inline the same row, attention and panel code the separate kernels run (the same instructions,
 * hence the same bits) and the shared static helpers stay static. The order matters: a file uses only what the
 * files above it define. */

#include "day0_internal.h"

#include "abi.c"
#include "threads.c"
#include "shm_allreduce.c"
#include "elementwise.c"
#include "attention_decode.c"
#include "attention_prefill.c"
#include "experts.c"
#include "panels.c"
#include "expert_panels.c"
#include "decode_layers.c"
