"""Resource planner: weight and KV bytes, candidate TP × PP × EP plans, per-device memory, the chosen plan.

Memory model (per device; docs/planner.md explains it at length):

- weights: quantisable linear weights at the dtype's bits (+ scale overhead for int4 and fp8); everything else
  (embeddings, LM head, norms, biases, routers) at 16 bits for quantised dtypes and at the dtype otherwise.
  Attention and dense-MLP weights split over ``tp``; MLA down-projections are replicated; routed experts split
  over the whole stage (``max(tp, ep)`` devices); embedding and head are vocabulary-parallel over ``tp`` on the
  first and last pipeline stage; ``pp`` stages take ⌈L/pp⌉ or ⌊L/pp⌋ layers and the heaviest stage decides.
- KV pool: what is left of ``memory × (1 - headroom)`` after weights, activations, communication buffers and a
  runtime overhead. A plan fits when the pool holds one sequence of ``min_context`` tokens.
- activations: one chunked-prefill step of ``prefill_tokens`` tokens plus fp32 logits for ``max_seqs`` rows.
- communication buffers: all-reduce (tp), all-to-all dispatch/combine (ep) and send/recv (pp) of one step.

Plans are (tp, pp, ep) with devices = pp × max(tp, ep); when ep > tp attention is data-parallel over ep / tp
replicas (each serves its own sequences). Deployment rules (``search.layout_problem``; pinned degrees too): tp
divides the query heads and divides or is a multiple of the KV heads, and divides the devices of a node (TP stays
inside a node); ep divides the experts; pp > 1 only with stages of whole nodes (PP spans nodes); past one node a
plan is whole nodes, within one it divides the node; pp is a divisor of the layer count or a power of two.
"""

from __future__ import annotations

from contract.planner.memory import (
    DTYPES,
    PlanSettings,
    activation_bytes,
    kv_bytes_per_token,
    kv_layer_bytes,
    normalize_dtype,
    resolve_dtype,
    weight_bytes,
)
from contract.planner.report import plan_report

__all__ = [
    "DTYPES",
    "PlanSettings",
    "activation_bytes",
    "kv_bytes_per_token",
    "kv_layer_bytes",
    "normalize_dtype",
    "resolve_dtype",
    "plan_report",
    "weight_bytes",
]
