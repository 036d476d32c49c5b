"""LLaVA under tensor and pipeline parallelism over gloo processes: tp=2, pp=2 and tp=2 x pp=2 reproduce the
single-process logits (fp32, 1e-5) of image + text prompts batched with a text-only one, and its greedy tokens
through the engine (paged KV cache, chunked prefill). The vision tower and projector live on the first stage
only (whole on each of its TP ranks), which encodes each request's images once; later stages hold none of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.distributed import ParallelState, get_parallel_state, launch, set_parallel_state
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.loader import load_model
from agents.runtime.models.decoder import StageSkip, stage_layers
from agents.runtime.testing.make_model import cached_model

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

PROMPT = "<s><|im_start|>user\n<image>what is in the picture<image>?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
VISION = ("vision_tower.", "multi_modal_projector.")


def _image(seed: int, size: tuple[int, int]) -> object:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (*size, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(cached_model("llava"))  # built here once, not raced by the ranks


@pytest.fixture(scope="module")
def requests(model_dir) -> list[tuple[list[int], torch.Tensor | None]]:
    """(prompt ids, pixel values or None): two images, text only, one image (the text request in between)."""
    processor = transformers.AutoProcessor.from_pretrained(model_dir)
    out: list[tuple[list[int], torch.Tensor | None]] = []
    for prompt, images in ((PROMPT, [_image(0, (40, 52)), _image(1, (64, 30))]), (None, None),
                           (PROMPT.replace("<image>?", "?"), [_image(2, (32, 32))])):
        if prompt is None:
            out.append((processor.tokenizer.encode("the quick brown fox", add_special_tokens=False), None))
            continue
        enc = processor(images=images, text=prompt, return_tensors="pt", add_special_tokens=False)
        out.append((enc["input_ids"][0].tolist(), enc["pixel_values"]))
    return out


def run_model(model_dir: str, requests: list) -> tuple:
    """Logits [T, vocab] of every request in one batch (image features in place of the placeholders on the
    first stage); greedy tokens through the engine, all requests together, prefill in 24-token chunks (the
    image prompts take several); how many images this rank encoded; the layers it holds; whether it holds
    vision tensors (parameters and the checkpoint names it declares)."""
    loaded = load_model(model_dir)
    assert loaded.report["ok"], loaded.report["problems"]
    model = loaded.model
    image_token = model.image_token_id
    lengths = [len(ids) for ids, _ in requests]
    ids = torch.tensor([t for r, _ in requests for t in r])
    positions = torch.cat([torch.arange(n) for n in lengths])
    rows, features, offset = [], [], 0
    for prompt, pixels in requests:
        if pixels is not None and model.is_first:
            rows += [offset + p for p, t in enumerate(prompt) if t == image_token]
            features.append(model.encode_images(pixels))
        offset += len(prompt)
    embeds = (torch.tensor(rows), torch.cat(features)) if features else None
    hidden = model.forward(ids, positions, ForwardContext.for_prompts(lengths), input_embeds=embeds).hidden
    logits = model.compute_logits(hidden)

    engine = LLMEngine(model_dir, model=model, config=loaded.config, num_blocks=64, block_size=4,
                       max_num_batched_tokens=24)
    before = getattr(model, "num_image_encodes", 0)
    rids = [engine.add_request(prompt, GREEDY, images=None if pixels is None else
                               ImageInputs.for_prompt(pixels, prompt, image_token)) for prompt, pixels in requests]
    final: dict[str, list[int]] = {}
    while len(final) < len(rids):
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.output_token_ids
    held = [i for i, layer in enumerate(model.model.layers) if not isinstance(layer, StageSkip)]
    vision_params = any(n.startswith(VISION) for n, _ in model.named_parameters())
    vision_declared = any(n.startswith(VISION) for n in model.checkpoint_tensors())
    return (logits, [final[r] for r in rids], model.num_image_encodes - before, held, vision_params,
            vision_declared)


def run_layouts(layouts: list[tuple[int, int]], model_dir: str, requests: list) -> dict:
    """Each (tp, pp) layout in the same processes: the ranks adopt it, then load and run."""
    rank, out = torch.distributed.get_rank(), {}
    for tp, pp in layouts:
        set_parallel_state(tp, 1, rank, pp)
        out[(tp, pp)] = (get_parallel_state(), run_model(model_dir, requests))
    return out


@pytest.fixture(scope="module")
def single(model_dir, requests) -> tuple:
    return run_model(model_dir, requests)


def _check(per_rank: list[dict], single: tuple, layout: tuple[int, int], requests: list) -> None:
    tp, pp = layout
    images = sum(p.shape[0] for _, p in requests if p is not None)
    assert single[2] == images  # once per request's image, however many chunks its prompt takes
    for rank, rank_out in enumerate(per_rank):
        state, (logits, tokens, encoded, held, vision_params, vision_declared) = rank_out[layout]
        assert state == ParallelState.of(rank, len(per_rank), tp, 1, pp)
        torch.testing.assert_close(logits, single[0], atol=1e-5, rtol=0,
                                   msg=lambda m, r=rank: f"rank {r} tp={tp} pp={pp}: {m}")
        assert tokens == single[1], (rank, layout)
        first = state.pp_rank == 0
        assert held == list(range(*stage_layers(len(single[3]), pp, state.pp_rank)))
        assert (vision_params, vision_declared) == (first, first), (rank, layout)  # stage 0's, whole on each TP rank
        assert encoded == (images if first else 0), (rank, layout)


@pytest.mark.slow
def test_llava_under_tp_2_and_pp_2_matches_a_single_process(model_dir, requests, single) -> None:
    layouts = [(2, 1), (1, 2)]
    per_rank = launch(run_layouts, 2, layouts, model_dir, requests, timeout=600)
    for layout in layouts:
        _check(per_rank, single, layout, requests)


@pytest.mark.slow  # four gloo ranks on a 2-core host
def test_llava_under_tp_2_by_pp_2_matches_a_single_process(model_dir, requests, single) -> None:
    per_rank = launch(run_layouts, 4, [(2, 2)], model_dir, requests, timeout=900)
    _check(per_rank, single, (2, 2), requests)


def test_a_later_stage_refuses_to_encode_images(model_dir) -> None:
    set_parallel_state(1, 1, 1, 2)  # rank 1 of two stages (no process group: sizes only)
    try:
        model = load_model(model_dir).model
    finally:
        set_parallel_state()
    assert model.vision_tower is None and model.multi_modal_projector is None
    with pytest.raises(RuntimeError, match="pipeline stage 1 holds no vision tower: stage 0 encodes the images"):
        model.encode_images(torch.zeros(1, 3, 32, 32))
