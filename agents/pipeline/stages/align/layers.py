"""Per-layer alignment: the hidden state after every decoder block, target against the reference, on the
fixed prompts. ``cosine`` is the worst per-token cosine similarity (a fault at one position shows);
``max_rel_err`` is the largest absolute difference over the reference's largest magnitude in that layer.

When the target runs in a lower precision (bf16, fp16), the rows compare it with the fp32 reference layer by
layer, and each row also carries ``fp32_cosine``: the runtime itself in fp32 at that layer. Real weights show
what random ones never do (large activations in a few middle layers cost bf16 most there); the pair tells a
precision loss (``fp32_cosine`` ≈ 1) from an implementation fault (both low)."""

from __future__ import annotations

from typing import Any

import torch

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.models import decoder_layers, fp32_target, reference_forward, target_forward


def compare(target: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Cosine (worst row), max relative and max absolute error of ``target`` vs ``ref``, both [T, D]."""
    t, r = target.double(), ref.double()
    cos = torch.nn.functional.cosine_similarity(t, r, dim=-1, eps=1e-12)  # [T]
    diff = (t - r).abs()
    scale = r.abs().max().clamp_min(1e-12)
    return {
        "cosine": float(cos.min()),
        "max_rel_err": float(diff.max() / scale),
        "max_abs_err": float(diff.max()),
    }


def run_layers(ctx: StageContext, target: Any, ref: torch.nn.Module, seqs: list[list[int]],
               thresholds: dict[str, float]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per decoder layer: {layer, cosine, max_rel_err, max_abs_err, passed}; plus notes."""
    num_layers = ctx.config.get("num_hidden_layers") or (ctx.config.get("text_config") or {}).get("num_hidden_layers")
    if not num_layers:
        raise StageFailed("config.json has no num_hidden_layers (nor text_config.num_hidden_layers)")
    num_layers = int(num_layers)
    _, target_layers = target_forward(ctx, target, seqs, hidden_states=True)
    if target_layers is None:
        return [], ["the target returned no per-layer hidden states: layers cannot be compared"]
    ref_blocks = decoder_layers(ref, num_layers)
    per_seq = [reference_forward(ref, seq, ref_blocks)[1] for seq in seqs]
    ref_layers = [torch.cat([layers[i] for layers in per_seq], 0) for i in range(num_layers)]  # each [T, hidden]
    notes: list[str] = []
    if len(target_layers) != num_layers:
        notes.append(f"the target reported {len(target_layers)} layers, the reference has {num_layers}")
    fp32_layers = None
    if ctx.dtype != "float32":
        _, fp32_layers = target_forward(ctx, fp32_target(ctx), seqs, hidden_states=True)
        notes.append(f"layers: the {ctx.dtype} target against the fp32 reference; fp32_cosine is the runtime in fp32")
    rows: list[dict[str, Any]] = []
    limit = thresholds["layer_cosine"]
    max_rel = thresholds.get("layer_max_rel_err")  # optional gate, off unless a job sets it
    for i in range(num_layers):
        if i >= len(target_layers) or target_layers[i].shape != ref_layers[i].shape:
            got = tuple(target_layers[i].shape) if i < len(target_layers) else None
            rows.append({"layer": i, "cosine": None, "max_rel_err": None, "max_abs_err": None, "passed": False,
                         "problem": f"target hidden state shape {got}, reference {tuple(ref_layers[i].shape)}"})
            continue
        row = {"layer": i, **compare(target_layers[i], ref_layers[i]), "dtype": ctx.dtype}
        if fp32_layers is not None and i < len(fp32_layers):
            row["fp32_cosine"] = compare(fp32_layers[i], ref_layers[i])["cosine"]
        row["passed"] = row["cosine"] >= limit and (max_rel is None or row["max_rel_err"] <= max_rel)
        rows.append(row)
    return rows, notes
