"""The tiny LLaVA (CLIP tower + projector + native Llama decoder) against transformers in fp32: image features,
logits at every prompt position, greedy tokens alone and batched with text-only requests under chunked
prefill, features encoded once per request; strict loading covers the vision tower."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.engine.model_runner import ModelRunner
from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.loader import load_model
from agents.runtime.testing.make_model import cached_model

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
PROMPT = "<s><|im_start|>user\n<image>what is in the picture<image>?<|im_end|>\n<|im_start|>assistant\n"


def _image(seed: int, size: tuple[int, int] = (40, 52)) -> object:
    pixels = np.random.RandomState(seed).randint(0, 256, (*size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def model_dir():
    return cached_model("llava")


@pytest.fixture(scope="module")
def reference(model_dir):
    model = transformers.LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, transformers.AutoProcessor.from_pretrained(model_dir)


def _inputs(processor, prompt: str, images: list) -> dict:
    return processor(images=images, text=prompt, return_tensors="pt", add_special_tokens=False)


def test_strict_load_covers_the_vision_tower(model_dir):
    result = load_model(model_dir)
    assert result.report["ok"], result.report["problems"]
    expected = result.model.checkpoint_tensors()
    assert any(n.startswith("vision_tower.encoder.layers.1.") for n in expected)
    assert any(n.startswith("multi_modal_projector.linear_2.") for n in expected)
    assert "language_model.model.layers.0.self_attn.q_proj.weight" in expected
    assert result.model.path == "native"


def test_image_features_and_logits_equal_transformers(model_dir, reference):
    ref, processor = reference
    enc = _inputs(processor, PROMPT, [_image(0), _image(1, (64, 30))])
    ids = enc["input_ids"][0].tolist()
    model = load_model(model_dir).model
    want_features = ref.get_image_features(pixel_values=enc["pixel_values"], vision_feature_layer=-2,
                                           vision_feature_select_strategy="default").pooler_output
    features = model.encode_images(enc["pixel_values"])  # [2 * 16, hidden]
    assert features.shape == (32, 64) and ids.count(model.image_token_id) == 32
    torch.testing.assert_close(features, torch.cat(list(want_features)), rtol=1e-5, atol=1e-5)

    runner = ModelRunner(model, "cpu", block_size=16, num_blocks=8)
    n = len(ids)
    images = ImageInputs.for_prompt(enc["pixel_values"], ids, model.image_token_id)
    offsets, rows = images.chunk_rows(0, n)
    inputs = {
        "ids": ids, "positions": list(range(n)), "slots": list(range(n)), "cu": [0, n], "seqlens_k": [n],
        "tables": [list(range(8))], "last": list(range(n)), "max_q": n, "is_decode": False,
        "embed_rows": offsets, "embeds": images.encoded(model.encode_images)[rows],
    }
    logits, _ = runner.execute(inputs)  # [n, vocab]
    with torch.no_grad():
        want = ref(**enc).logits[0]
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
    # the image matters: with the placeholders' plain embeddings the logits differ
    plain, _ = runner.execute({k: v for k, v in inputs.items() if k not in ("embed_rows", "embeds")})
    assert (plain - want).abs().max() > 1e-2


def test_greedy_alone_and_batched_with_text_under_chunked_prefill(model_dir, reference):
    ref, processor = reference
    engine = LLMEngine(model_dir, num_blocks=64, max_num_batched_tokens=24)  # 50-token prompt: 3 chunks
    cases = [[_image(2)], [_image(3), _image(4, (20, 80))]]
    prompts = [PROMPT.replace("<image>?", "?"), PROMPT]
    expected, requests = [], []
    for prompt, images in zip(prompts, cases, strict=True):
        enc = _inputs(processor, prompt, images)
        ids = enc["input_ids"][0].tolist()
        out = ref.generate(**enc, max_new_tokens=GREEDY.max_tokens, do_sample=False)
        expected.append(out[0, len(ids):].tolist())
        requests.append((ids, ImageInputs.for_prompt(enc["pixel_values"], ids, engine.model.image_token_id)))

    def run(batch: list[tuple[list[int], ImageInputs | None]]) -> list[list[int]]:
        rids = [engine.add_request(ids, GREEDY, images=images) for ids, images in batch]
        final: dict[str, list[int]] = {}
        while len(final) < len(rids):
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = out.output_token_ids
        return [final[r] for r in rids]

    text_ids = engine.tokenizer.encode("the quick brown fox")
    text_alone = run([(text_ids, None)])[0]
    before = engine.model.num_image_encodes
    assert run([requests[0]]) == [expected[0]]
    assert engine.model.num_image_encodes - before == 1  # once, not per chunk nor per decode step
    # images and text-only prompts in the same steps, the text request between the two image requests
    fresh = [(ids, ImageInputs(images.pixel_values, images.positions)) for ids, images in requests]
    mixed = run([fresh[0], (text_ids, None), fresh[1]])
    assert mixed == [expected[0], text_alone, expected[1]]
    assert engine.model.num_image_encodes - before == 1 + 1 + 2
    assert engine.stats()["kv_blocks_used"] == 0


def test_a_text_only_model_refuses_images():
    from agents.runtime.engine import RequestError

    engine = LLMEngine(cached_model("llama"), num_blocks=16)
    images = ImageInputs(torch.zeros(1, 3, 32, 32), [1, 2])
    with pytest.raises(RequestError, match="does not take images"):
        engine.add_request([0, 5, 6, 7], GREEDY, images=images)


def test_preempted_image_requests_recompute_with_the_same_features(model_dir, reference):
    ref, processor = reference
    requests, expected = [], []
    for seed in (5, 6, 7):
        enc = _inputs(processor, PROMPT, [_image(seed), _image(seed + 10)])
        ids = enc["input_ids"][0].tolist()
        out = ref.generate(**enc, max_new_tokens=16, do_sample=False)
        expected.append(out[0, len(ids):].tolist())
        requests.append((ids, enc["pixel_values"]))
    # three 50-token prompts growing to 66 tokens in a pool of 14 blocks of 8: someone must be preempted
    tight = LLMEngine(model_dir, num_blocks=14, block_size=8, max_num_batched_tokens=32)
    params = SamplingParams(max_tokens=16, temperature=0.0)
    rids = [tight.add_request(ids, params, images=ImageInputs.for_prompt(pv, ids, tight.model.image_token_id))
            for ids, pv in requests]
    final: dict[str, list[int]] = {}
    while len(final) < len(rids):
        for out in tight.step():
            if out.finished:
                final[out.request_id] = out.output_token_ids
    assert [final[r] for r in rids] == expected
    stats = tight.stats()
    assert stats["num_preemptions"] > 0 and stats["kv_blocks_free"] == 14
    assert tight.model.num_image_encodes == 6  # each request's two images once, preemptions included


def test_a_siglip_tower_answers_as_transformers():
    """LLaVA on a SigLIP tower (no CLS token: all 16 patches are image tokens, the "full" strategy): features
    and greedy tokens equal transformers'."""
    path = cached_model("llava-siglip")
    ref = transformers.LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    processor = transformers.AutoProcessor.from_pretrained(path)
    enc = _inputs(processor, PROMPT, [_image(8), _image(9, (64, 30))])
    ids = enc["input_ids"][0].tolist()
    engine = LLMEngine(path, num_blocks=32, max_num_batched_tokens=24)
    model = engine.model
    assert model.path == "native" and ids.count(model.image_token_id) == 2 * 16
    want_features = ref.get_image_features(pixel_values=enc["pixel_values"], vision_feature_layer=-2,
                                           vision_feature_select_strategy="full").pooler_output
    torch.testing.assert_close(model.encode_images(enc["pixel_values"]), torch.cat(list(want_features)),
                               rtol=1e-5, atol=1e-5)
    want = ref.generate(**enc, max_new_tokens=GREEDY.max_tokens, do_sample=False)[0, len(ids):].tolist()
    rid = engine.add_request(ids, GREEDY, images=ImageInputs.for_prompt(enc["pixel_values"], ids, model.image_token_id))
    got: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid and out.finished:
                got = out.output_token_ids
    assert got == want
