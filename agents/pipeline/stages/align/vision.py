"""Alignment of a vision-language model's image path against ``transformers`` fp32 (same checkpoint): the vision
encoder's selected hidden states and the projector's output (cosine similarity and relative error per image),
then an end-to-end greedy comparison on image + text prompts, the runtime's engine (paged, chunked prefill,
image features in place of the placeholders) against the reference's ``generate``.

The text-only checks (operators, layers, e2e, KV cache) run on the decoder: ``support.vision_reference`` gives
the reference's own language model and LM head as a causal LM, so those checks see the same modules."""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.endpoints import probe_image_png
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.models import align_thresholds, fp32_target
from agents.pipeline.support.vision_reference import reference_vlm

IMAGE_PROMPTS: tuple[tuple[str, int], ...] = (
    ("Describe this picture.", 0),
    ("What colour is the square?", 1),
)
NEW_TOKENS = 12


def probe_images(ctx: StageContext) -> list[Any]:
    """Deterministic pictures of two sizes (the processor resizes and crops them)."""
    from PIL import Image

    return [Image.open(io.BytesIO(probe_image_png(side))).convert("RGB") for side in (64, 48)]


def _compare(target: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    t, r = target.double().flatten(), ref.double().flatten()
    cosine = float(torch.nn.functional.cosine_similarity(t, r, dim=0))
    rel = float((t - r).norm() / r.norm().clamp_min(1e-30))
    return {"cosine": round(cosine, 8), "rel_err": rel, "max_abs_err": float((t - r).abs().max())}


def _processor(ctx: StageContext) -> Any:
    from agents.runtime.server.images import load_processor

    return load_processor(ctx.model_dir)


def run(ctx: StageContext, target: Any | None = None) -> dict[str, Any]:
    """The ``vision`` part of the align section: ``encoder`` and ``projector`` rows per image, ``e2e`` per image
    prompt, ``passed``."""
    thresholds = align_thresholds(ctx)
    min_cos, max_rel = thresholds.get("vision_min_cosine", 0.9999), thresholds.get("vision_max_rel_err", 1e-3)
    model = target if target is not None else fp32_target(ctx)
    if not hasattr(model, "encode_images"):
        raise StageFailed("the runtime model has no image encoder, although the config has a vision tower")
    ref = reference_vlm(ctx)
    processor = _processor(ctx)
    images = probe_images(ctx)
    pixels = processor.image_processor(images, return_tensors="pt")
    if "image_grid_thw" in pixels:  # dynamic resolution: the tower's patches and merger, per image's grid
        rows = _grid_feature_rows(model, ref, pixels, min_cos, max_rel)
    else:
        rows = _feature_rows(model, ref, pixels["pixel_values"], min_cos, max_rel)  # [N, C, H, W]
    e2e = _greedy_e2e(ctx, ref, processor, images)  # outside inference mode: the engine owns its cache
    passed = all(r["passed"] for r in rows) and all(p["match"] for p in e2e)
    return {"passed": passed, "rows": rows, "e2e": e2e,
            "thresholds": {"vision_min_cosine": min_cos, "vision_max_rel_err": max_rel}}


@torch.inference_mode()
def _feature_rows(model: Any, ref: nn.Module, pixels: torch.Tensor, min_cos: float,
                  max_rel: float) -> list[dict[str, Any]]:
    """Per image: the vision encoder's selected hidden states and the projector's output, target vs reference."""
    layer, strategy = ref.config.vision_feature_layer, ref.config.vision_feature_select_strategy
    want = ref.model.vision_tower(pixels, output_hidden_states=True, return_dict=True).hidden_states[layer]
    got = model.vision_tower(pixels.to(model.dtype), output_hidden_states=True, return_dict=True).hidden_states[layer]
    if strategy == "default":
        want, got = want[:, 1:], got[:, 1:]
    want_proj = ref.model.multi_modal_projector(want)
    got_proj = model.encode_images(pixels).reshape(want_proj.shape).float()
    rows: list[dict[str, Any]] = []
    for i in range(pixels.shape[0]):
        for part, t, r in (("vision_encoder", got[i], want[i]), ("projector", got_proj[i], want_proj[i])):
            row = {"part": part, "image": i, **_compare(t.float(), r)}
            row["passed"] = row["cosine"] >= min_cos and row["rel_err"] <= max_rel
            rows.append(row)
    return rows


@torch.inference_mode()
def _grid_feature_rows(model: Any, ref: nn.Module, pixels: Any, min_cos: float,
                       max_rel: float) -> list[dict[str, Any]]:
    """Per image of a dynamic-resolution tower (Qwen2-VL, Qwen2.5-VL): the vision blocks' output (its patches,
    before merging) and the patch merger's output (the image's tokens), target vs reference."""
    grid = pixels["image_grid_thw"]  # [N, 3]
    if not hasattr(model, "hf_model"):
        raise StageFailed("a dynamic-resolution vision tower is compared on the fallback path only")
    want = ref.model.visual(pixels["pixel_values"], grid_thw=grid)
    got = model.hf_model.model.visual(pixels["pixel_values"].to(model.device, model.dtype), grid_thw=grid.to(model.device))
    encoded = model.encode_images(pixels["pixel_values"], image_grid_thw=grid).float().cpu()  # [tokens, hidden]
    patches = grid.prod(-1).tolist()
    tokens = [n // int(ref.model.visual.spatial_merge_size) ** 2 for n in patches]
    rows: list[dict[str, Any]] = []
    # the blocks' output is in window order, the same for both sides; the merger's is in image order
    parts = (torch.split(got.last_hidden_state.float().cpu(), patches), torch.split(want.last_hidden_state, patches),
             torch.split(encoded, tokens), torch.split(want.pooler_output, tokens))
    for i, (tb, rb, tm, rm) in enumerate(zip(*parts, strict=True)):
        for part, t, r in (("vision_encoder", tb, rb), ("projector", tm, rm)):
            row = {"part": part, "image": i, **_compare(t, r)}
            row["passed"] = row["cosine"] >= min_cos and row["rel_err"] <= max_rel
            rows.append(row)
    return rows


def _greedy_e2e(ctx: StageContext, ref: nn.Module, processor: Any, images: list[Any]) -> list[dict[str, Any]]:
    """Each image prompt greedily through the runtime's engine (an fp32 engine of its own, with the prompt in
    several prefill chunks) and through ``transformers``' ``generate``: the tokens must be equal."""
    from agents.runtime.engine import LLMEngine, SamplingParams
    from agents.runtime.engine.multimodal import ImageInputs

    engine = ctx.state.vision_engine
    if engine is None:
        engine = LLMEngine(ctx.model_dir, dtype="float32", device=ctx.device, num_blocks=64,
                           max_num_batched_tokens=16)
        ctx.state.vision_engine = engine
    out = []
    for question, index in IMAGE_PROMPTS:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        enc = processor(text=[text], images=[images[index]], return_tensors="pt", add_special_tokens=False)
        ids = enc["input_ids"][0].tolist()
        with torch.inference_mode():
            want = ref.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
        inputs = ImageInputs.from_processor(enc, ids, engine.model.image_token_id)
        rid = engine.add_request(ids, SamplingParams(max_tokens=len(want), temperature=0.0), images=inputs)
        got: list[int] = []
        while engine.has_unfinished():
            for o in engine.step():
                if o.request_id == rid and o.finished:
                    got = list(o.output_token_ids or [])
        out.append({"prompt": question, "image": index, "prompt_tokens": len(ids), "reference": want,
                    "target": got, "match": got == want})
    return out
