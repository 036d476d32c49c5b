"""The tiny Qwen2.5-VL (dynamic resolution, image grids, M-RoPE, ``<|vision_start|><|image_pad|>…<|vision_end|>``),
and Qwen2-VL and Qwen3-VL beside it, on the transformers fallback against transformers itself in fp32: the placeholder expanded to each image's grid,
image features and logits at every prompt position, greedy tokens alone and batched with text-only requests,
features encoded once per request although the fallback recomputes every sequence each step; over HTTP the
chat API and the OpenAI SDK answer an image as transformers does."""

from __future__ import annotations

import base64
import io
import threading

import httpx
import numpy as np
import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.loader import load_model
from agents.runtime.server.images import GridVisionProcessor, ImageLimits, load_processor
from agents.runtime.testing.make_model import cached_model

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
QUESTION = "what is in the picture?"


def _image(seed: int, size: tuple[int, int] = (40, 52)) -> object:
    pixels = np.random.RandomState(seed).randint(0, 256, (*size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _png(seed: int, size: tuple[int, int] = (40, 52)) -> bytes:
    buf = io.BytesIO()
    _image(seed, size).save(buf, format="PNG")
    return buf.getvalue()


def _messages(n_images: int, question: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": [*({"type": "image"} for _ in range(n_images)),
                                         {"type": "text", "text": question}]}]


@pytest.fixture(scope="module")
def model_dir():
    return cached_model("qwen2.5-vl")


@pytest.fixture(scope="module")
def processor(model_dir) -> GridVisionProcessor:
    return load_processor(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir):
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


def _encode(processor, n_images: int, images: list, question: str = QUESTION) -> dict:
    text = processor.apply_chat_template(_messages(n_images, question), add_generation_prompt=True)
    return processor(text=[text], images=images, return_tensors="pt")


def test_each_placeholder_takes_its_images_grid(processor):
    assert isinstance(processor, GridVisionProcessor)
    assert processor.image_placeholder == "<|vision_start|><|image_pad|><|vision_end|>"
    sizes = [(40, 52), (64, 30), (20, 20), (90, 90)]
    enc = _encode(processor, len(sizes), [_image(i, s) for i, s in enumerate(sizes)])
    ids = enc["input_ids"][0].tolist()
    image_id = processor.image_token_id
    # transformers' own count for an image of that size (patches / merge^2), independent of our expansion
    want = [processor.image_processor.get_number_of_image_patches(h, w, {}) // 4 for h, w in sizes]
    assert len(set(want)) > 1  # dynamic resolution: the sizes give different grids
    runs, run = [], 0
    for token in ids:
        if token == image_id:
            run += 1
        elif run:
            runs.append(run)
            run = 0
    assert runs == want == processor.tokens_per_image(enc["image_grid_thw"])
    assert enc["mm_token_type_ids"][0].tolist() == [int(t == image_id) for t in ids]


def test_strict_load_covers_the_vision_tower(model_dir):
    result = load_model(model_dir)
    assert result.report["ok"], result.report["problems"]
    model = result.model
    assert model.path == "fallback" and model.takes_images and model.image_token_id == 514
    expected = model.expected_tensors()  # the hub's layout (transformers renames these in memory)
    assert {"visual.blocks.1.attn.qkv.weight", "visual.merger.mlp.2.weight", "visual.patch_embed.proj.weight",
            "model.layers.1.self_attn.q_proj.bias", "lm_head.weight"} <= set(expected)


def test_image_features_and_logits_equal_transformers(model_dir, processor, reference):
    enc = _encode(processor, 2, [_image(0), _image(1, (64, 30))])
    ids = enc["input_ids"][0].tolist()
    model = load_model(model_dir).model
    want_features = reference.get_image_features(enc["pixel_values"], enc["image_grid_thw"]).pooler_output
    images = ImageInputs.from_processor(enc, ids, model.image_token_id)
    assert set(images.extra) == {"image_grid_thw"}
    torch.testing.assert_close(model.encode_images(enc["pixel_values"], **images.extra),
                               torch.cat(list(want_features)), rtol=1e-5, atol=1e-5)

    n = len(ids)
    input_ids = torch.tensor(ids)
    ctx = ForwardContext.for_prompts([n], device="cpu")
    with torch.no_grad():
        want = reference(**enc).logits[0]
    for _ in range(2):  # two recompute steps of the same request
        logits = model.compute_logits(model.forward(input_ids, torch.arange(n), ctx, images=[images]).hidden)
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)  # logits: [n, vocab]
    assert model.num_image_encodes == 2 + 2  # the check above, then once for the request (not per step)
    torch.testing.assert_close(images.features, torch.cat(list(want_features)), rtol=1e-5, atol=1e-5)
    # the image matters: without it (plain placeholder embeddings, 1-D positions) the logits differ
    plain = model.compute_logits(model.forward(input_ids, torch.arange(n), ctx).hidden)
    assert (plain - want).abs().max() > 1e-2


def test_greedy_alone_and_batched_with_text_requests(model_dir, processor, reference):
    engine = LLMEngine(model_dir, num_blocks=64)
    cases = [(1, [_image(2)]), (2, [_image(3), _image(4, (20, 80))])]
    expected, requests = [], []
    for n_images, images in cases:
        enc = _encode(processor, n_images, images)
        ids = enc["input_ids"][0].tolist()
        out = reference.generate(**enc, max_new_tokens=GREEDY.max_tokens, do_sample=False)
        expected.append(out[0, len(ids):].tolist())
        requests.append((ids, enc))

    def run(batch: list[tuple[list[int], ImageInputs | None]]) -> list[list[int]]:
        rids = [engine.add_request(ids, GREEDY, images=images) for ids, images in batch]
        final: dict[str, list[int]] = {}
        while len(final) < len(rids):
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = out.output_token_ids
        return [final[r] for r in rids]

    def fresh(i: int) -> tuple[list[int], ImageInputs]:
        ids, enc = requests[i]
        return ids, ImageInputs.from_processor(enc, ids, engine.model.image_token_id)

    text_ids = engine.tokenizer.encode("the quick brown fox")
    text_alone = run([(text_ids, None)])[0]
    assert run([fresh(0)]) == [expected[0]]
    assert engine.model.num_image_encodes == 1  # once, not at each of the 8 recompute steps
    mixed = run([fresh(0), (text_ids, None), fresh(1)])  # image and text-only sequences in the same steps
    assert mixed == [expected[0], text_alone, expected[1]]
    assert engine.model.num_image_encodes == 1 + 1 + 2


@pytest.mark.parametrize("arch", ["qwen2-vl", "qwen3-vl"])
def test_other_qwen_vl_generations_greedy_alone_and_batched_with_text(arch):
    """Qwen2-VL (LayerNorm/GELU tower, no windows) and Qwen3-VL (learned position grid, deepstack) on the same
    fallback image path."""
    path = cached_model(arch)
    processor = load_processor(path)
    ref = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    engine = LLMEngine(path, num_blocks=64)
    enc = _encode(processor, 2, [_image(5), _image(6, (30, 70))])
    ids = enc["input_ids"][0].tolist()
    want = ref.generate(**enc, max_new_tokens=GREEDY.max_tokens, do_sample=False)[0, len(ids):].tolist()
    text_ids = engine.tokenizer.encode("the quick brown fox")
    rids = [engine.add_request(ids, GREEDY, images=ImageInputs.from_processor(enc, ids, engine.model.image_token_id)),
            engine.add_request(text_ids, GREEDY)]
    final: dict[str, list[int]] = {}
    while len(final) < 2:
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.output_token_ids
    text_want = ref.generate(torch.tensor([text_ids]), max_new_tokens=GREEDY.max_tokens, do_sample=False)
    assert final[rids[0]] == want
    assert final[rids[1]] == text_want[0, len(text_ids):].tolist()
    assert engine.model.num_image_encodes == 2


def test_qwen3_vl_deepstack_features_ride_with_the_request():
    """Qwen3-VL adds merged outputs of early vision blocks to the image tokens inside the decoder: the logits
    equal transformers' only with them, so the request keeps the encoder's whole output, not just its tokens."""
    path = cached_model("qwen3-vl")
    processor = load_processor(path)
    ref = transformers.Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    enc = _encode(processor, 1, [_image(7)])
    ids = enc["input_ids"][0].tolist()
    model = load_model(path).model
    images = ImageInputs.from_processor(enc, ids, model.image_token_id)
    n = len(ids)
    ctx = ForwardContext.for_prompts([n], device="cpu")
    logits = model.compute_logits(model.forward(torch.tensor(ids), torch.arange(n), ctx, images=[images]).hidden)
    with torch.no_grad():
        want = ref(**enc).logits[0]
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
    assert len(images.encoder_output.deepstack_features) == 2
    images.encoder_output.deepstack_features = [tuple(torch.zeros_like(t) for t in layer)
                                                for layer in images.encoder_output.deepstack_features]
    without = model.compute_logits(model.forward(torch.tensor(ids), torch.arange(n), ctx, images=[images]).hidden)
    assert (without - want).abs().max() > 1e-3
    assert model.num_image_encodes == 1


# ---- over HTTP ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def url(model_dir):
    from tests.runtime.test_vlm_server import _serve

    server, base = _serve(LLMEngine(model_dir, num_blocks=64), "tiny-qwen-vl",
                          ImageLimits(max_images=3, max_bytes=64 * 1024, max_pixels=256 * 256))
    yield base
    server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def expected(processor, reference):
    """transformers' greedy answer (text) to QUESTION about image 0, and the prompt's length."""
    enc = _encode(processor, 1, [Image.open(io.BytesIO(_png(0)))])
    out = reference.generate(**enc, max_new_tokens=8, do_sample=False)[0, enc["input_ids"].shape[1]:]
    return processor.tokenizer.decode(out, skip_special_tokens=True), enc["input_ids"].shape[1]


def _chat(parts: list[dict]) -> dict:
    return {"model": "tiny-qwen-vl", "messages": [{"role": "user", "content": parts}], "max_tokens": 8,
            "temperature": 0}


def _url_part(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def test_chat_images_answer_as_transformers_beside_text_requests(url, expected):
    text, prompt_tokens = expected
    parts = [_url_part(_png(0)), {"type": "image", "data": base64.b64encode(_png(0)).decode()}]
    results: dict[int, httpx.Response] = {}

    def send(i: int) -> None:
        image = [parts[i % 2]] if i < 4 else []
        results[i] = httpx.post(f"{url}/v1/chat/completions",
                                json=_chat([*image, {"type": "text", "text": QUESTION}]), timeout=120)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code == 200 for r in results.values()), [r.text for r in results.values()]
    for i in range(4):
        body = results[i].json()
        assert body["choices"][0]["message"]["content"] == text
        assert body["usage"]["prompt_tokens"] == prompt_tokens  # <|image_pad|> expanded to the image's grid
    assert results[4].json()["usage"]["prompt_tokens"] < prompt_tokens - 4


def test_the_image_token_in_the_users_text_is_a_400(url):
    r = httpx.post(f"{url}/v1/chat/completions",
                   json=_chat([_url_part(_png(0)), {"type": "text", "text": "one <|image_pad|> two"}]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "2 image placeholders '<|image_pad|>' for 1 image(s)" in r.json()["error"]["message"]
    card = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert card["modalities"] == ["text", "image"] and card["image_token_id"] == 514


def test_openai_sdk_sends_an_image_streamed_and_not(url, expected):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": [_url_part(_png(0)), {"type": "text", "text": QUESTION}]}]
    whole = client.chat.completions.create(model="tiny-qwen-vl", messages=messages, max_tokens=8, temperature=0)
    assert whole.choices[0].message.content == expected[0]
    stream = client.chat.completions.create(model="tiny-qwen-vl", messages=messages, max_tokens=8, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected[0]


def test_bench_sends_images_per_request(url):
    from agents.runtime.bench import run_benchmark

    section = run_benchmark(url, concurrency=[2], input_len=6, output_len=3, num_prompts=2, long_context=False,
                            images_per_request=1)
    run = section["runs"][0]
    assert run["failed"] == 0 and run["completed"] == 2, run
    assert run["input_tokens"] > 2 * 16  # a 64 x 64 picture: an 8 x 8 patch grid, 16 merged image tokens
