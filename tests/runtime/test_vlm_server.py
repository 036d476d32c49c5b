"""Images through the chat API over real HTTP on the tiny LLaVA: data: URLs and the seeds' ``image`` parts answer
what transformers answers; every bad image part is a 400 naming it; remote URLs only when allowed; the OpenAI
SDK sends an image and reads the answer, streamed and not."""

from __future__ import annotations

import base64
import http.server
import io
import threading
import time

import httpx
import numpy as np
import pytest
import torch

from agents.runtime.engine import LLMEngine
from agents.runtime.server import create_app
from agents.runtime.server.images import ImageLimits
from agents.runtime.server.launcher import ServerThread
from agents.runtime.testing.make_model import cached_model

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
LIMITS = ImageLimits(max_images=3, max_bytes=64 * 1024, max_pixels=256 * 256)
QUESTION = "what is in the picture?"


def _png(seed: int, size: tuple[int, int] = (40, 52)) -> bytes:
    pixels = np.random.RandomState(seed).randint(0, 256, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _chat(parts: list[dict], **extra) -> dict:
    return {"model": "tiny-llava", "messages": [{"role": "user", "content": parts}], "max_tokens": 8,
            "temperature": 0, **extra}


def _serve(engine: LLMEngine, name: str, limits: ImageLimits):
    server = ServerThread(create_app(engine, name, image_limits=limits))
    base = server.__enter__()
    deadline = time.monotonic() + 60
    while httpx.get(f"{base}/ready").status_code != 200:
        assert time.monotonic() < deadline, "server not ready after 60 s"
        time.sleep(0.05)
    return server, base


@pytest.fixture(scope="module")
def model_dir():
    return cached_model("llava")


@pytest.fixture(scope="module")
def url(model_dir):
    server, base = _serve(LLMEngine(model_dir, num_blocks=128), "tiny-llava", LIMITS)
    yield base
    server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def expected(model_dir):
    """transformers' greedy answer (text) to QUESTION about image 0, from the same chat template."""
    ref = transformers.LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = transformers.AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    enc = processor(images=[Image.open(io.BytesIO(_png(0)))], text=text, return_tensors="pt",
                    add_special_tokens=False)
    out = ref.generate(**enc, max_new_tokens=8, do_sample=False)[0, enc["input_ids"].shape[1]:]
    return processor.tokenizer.decode(out, skip_special_tokens=True), enc["input_ids"].shape[1]


def test_data_url_and_image_part_answer_as_transformers(url, expected):
    text, prompt_tokens = expected
    for part in ({"type": "image_url", "image_url": {"url": _data_url(_png(0))}},
                 {"type": "image", "data": base64.b64encode(_png(0)).decode()}):
        r = httpx.post(f"{url}/v1/chat/completions", json=_chat([part, {"type": "text", "text": QUESTION}]),
                       timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["content"] == text
        assert body["usage"]["prompt_tokens"] == prompt_tokens  # 16 placeholder tokens per image, expanded


def test_images_and_text_requests_together(url, expected):
    results: dict[int, httpx.Response] = {}

    def send(i: int) -> None:
        parts = [{"type": "image_url", "image_url": {"url": _data_url(_png(0))}}] if i % 2 == 0 else []
        results[i] = httpx.post(f"{url}/v1/chat/completions",
                                json=_chat([*parts, {"type": "text", "text": QUESTION}]), timeout=60)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code == 200 for r in results.values())
    image_answers = {results[i].json()["choices"][0]["message"]["content"] for i in (0, 2, 4)}
    text_answers = {results[i].json()["choices"][0]["message"]["content"] for i in (1, 3, 5)}
    assert image_answers == {expected[0]} and len(text_answers) == 1


def _bad_cases() -> list[tuple[list[dict], str, str]]:
    ok = {"type": "image_url", "image_url": {"url": _data_url(_png(0))}}
    buf = io.BytesIO()
    Image.new("RGB", (300, 300), (200, 30, 90)).save(buf, format="PNG")  # 90,000 pixels > 65,536, few bytes
    big = buf.getvalue()
    noise = np.random.RandomState(2).randint(0, 256, (200, 200, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="BMP")  # 120 KB of bytes > 64 KiB
    return [
        ([{"type": "image", "data": base64.b64encode(b"not an image at all").decode()}],
         "messages[0].content[0]", "cannot decode the image"),
        ([ok, {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}],
         "messages[0].content[1].image_url.url", "not valid base64"),
        ([ok, ok, ok, ok], "messages[0].content[3]", "over the limit of 3"),
        ([{"type": "image_url", "image_url": {"url": _data_url(big)}}], "messages[0].content[0]", "pixels"),
        ([{"type": "image", "data": base64.b64encode(buf.getvalue()).decode()}], "messages[0].content[0].data",
         "larger than 65536 bytes"),
        ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
         "messages[0].content[0].image_url.url", "--allow-remote-images"),
        ([{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}],
         "messages[0].content[0].image_url.url", "data: URL or an http(s) URL"),
        ([{"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}],
         "messages[0].content[0].image_url.url", "image/*"),
        ([{"type": "image", "data": 5}], "messages[0].content[0].data", "base64 string"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_image_parts_are_400s_naming_the_part(url, case):
    parts, param, words = _bad_cases()[case]
    r = httpx.post(f"{url}/v1/chat/completions", json=_chat([*parts, {"type": "text", "text": "hi"}]), timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert httpx.get(f"{url}/health").status_code == 200


def test_the_placeholder_in_the_users_text_is_a_400(url):
    part = {"type": "image_url", "image_url": {"url": _data_url(_png(0))}}
    r = httpx.post(f"{url}/v1/chat/completions", json=_chat([part, {"type": "text", "text": "one <image> two"}]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "2 image placeholders '<image>' for 1 image(s)" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/chat/completions", json=_chat([{"type": "text", "text": "no picture <image>"}]))
    assert r.status_code == 400 and "image placeholder token 512 but no image" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny-llava", "prompt": [0, 512, 7], "max_tokens": 2})
    assert r.status_code == 400 and "but no image" in r.json()["error"]["message"]
    assert httpx.get(f"{url}/health").status_code == 200


def test_an_image_sent_to_a_text_only_model_is_a_400():
    server, base = _serve(LLMEngine(cached_model("llama"), num_blocks=32), "tiny-llama", LIMITS)
    try:
        part = {"type": "image_url", "image_url": {"url": _data_url(_png(0))}}
        r = httpx.post(f"{base}/v1/chat/completions",
                       json={**_chat([{"type": "text", "text": "hi"}, part]), "model": "tiny-llama"}, timeout=30)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "messages[0].content[1]"
        assert "does not take images" in r.json()["error"]["message"]
    finally:
        server.__exit__(None, None, None)


def test_remote_images_when_allowed(model_dir, expected):
    png = _png(0)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path != "/cat.png":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args: object) -> None:
            pass

    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    limits = ImageLimits(max_images=3, max_bytes=64 * 1024, max_pixels=256 * 256, allow_remote=True)
    server, base = _serve(LLMEngine(model_dir, num_blocks=64), "tiny-llava", limits)
    try:
        host = f"http://127.0.0.1:{images.server_address[1]}"
        r = httpx.post(f"{base}/v1/chat/completions", json=_chat(
            [{"type": "image_url", "image_url": {"url": f"{host}/cat.png"}}, {"type": "text", "text": QUESTION}]),
            timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == expected[0]
        r = httpx.post(f"{base}/v1/chat/completions", json=_chat(
            [{"type": "image_url", "image_url": {"url": f"{host}/missing.png"}}]), timeout=60)
        assert r.status_code == 400 and "HTTP 404" in r.json()["error"]["message"]
    finally:
        server.__exit__(None, None, None)
        images.shutdown()


def test_openai_sdk_sends_an_image_streamed_and_not(url, expected):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _data_url(_png(0))}}, {"type": "text", "text": QUESTION}]}]
    whole = client.chat.completions.create(model="tiny-llava", messages=messages, max_tokens=8, temperature=0)
    assert whole.choices[0].message.content == expected[0]
    stream = client.chat.completions.create(model="tiny-llava", messages=messages, max_tokens=8, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected[0]
    with pytest.raises(openai.BadRequestError, match="cannot decode the image"):
        client.chat.completions.create(model="tiny-llava", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"xx").decode()}},
        ]}])


def test_bench_sends_images_per_request(url):
    from agents.runtime.bench import run_benchmark

    section = run_benchmark(url, concurrency=[1, 2], input_len=6, output_len=3, num_prompts=4, long_context=False,
                            images_per_request=2)
    assert section["images_per_request"] == 2
    assert all(run["failed"] == 0 and run["completed"] == 4 for run in section["runs"]), section["runs"]
    assert all(run["input_tokens"] > 4 * 2 * 16 for run in section["runs"])  # 16 image tokens per image
    # text runs on a VLM: its card names the image token, which random token-id prompts then never draw
    card = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert card["modalities"] == ["text", "image"] and card["image_token_id"] == 512
    text = run_benchmark(url, concurrency=[4], input_len=64, output_len=2, num_prompts=8, long_input_len=200)
    assert text["runs"][0]["failed"] == 0 and text["long_context"]["failed"] == 0
    with pytest.raises(ValueError, match="images_per_request"):
        run_benchmark(url, concurrency=[1], images_per_request=-1)


@pytest.mark.slow  # two (four) gloo ranks load the model
@pytest.mark.parametrize("layout", [["--tp", "2"], ["--pp", "2"], ["--tp", "2", "--pp", "2"]],
                         ids=["tp2", "pp2", "tp2-pp2"])
def test_parallel_serve_answers_images_as_one_process(model_dir, expected, tmp_path, layout):
    """Rank 0 (stage 0) encodes the image and sends its features with the step; later stages take hidden states."""
    import os
    import subprocess
    import sys

    from agents.runtime.server.launcher import free_port
    from tests.runtime.served import wait_until_ready

    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "day0cli", "serve", str(model_dir), *layout,
                                 "--port", str(port), "--num-blocks", "64", "--served-model-name", "tiny-llava"],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, proc, log)
        part = {"type": "image_url", "image_url": {"url": _data_url(_png(0))}}
        r = httpx.post(f"{url}/v1/chat/completions", json=_chat([part, {"type": "text", "text": QUESTION}]),
                       timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == expected[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
