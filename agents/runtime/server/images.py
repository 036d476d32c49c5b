"""Images in chat messages: ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` and the
seeds' ``{"type": "image", "data": "<base64>"}``. Each part is decoded and bounded (count, bytes, pixels), the
message keeps the model's image placeholder in its place, and the model's own processor turns the images into
pixel values and expands each placeholder to the number of tokens its image takes. A remote http(s) URL is
refused unless the server allows remote images. Every bad part is a 400 naming it."""

from __future__ import annotations

import base64
import binascii
import io
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.server.errors import APIError

IMAGE_PART_TYPES = ("image_url", "image")


@dataclass(frozen=True)
class ImageLimits:
    """Bounds on the images of one request; ``allow_remote``: fetch http(s) URLs (off by default)."""

    max_images: int = 8
    max_bytes: int = 8 * 2**20
    max_pixels: int = 4096 * 4096
    allow_remote: bool = False
    remote_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_images", "max_bytes", "max_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


def image_parts(messages: Any) -> list[tuple[str, dict[str, Any]]]:
    """(``messages[i].content[j]``, part) of every image part, in order; other shapes are left to the template
    checks."""
    found: list[tuple[str, dict[str, Any]]] = []
    if not isinstance(messages, list):
        return found
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            found += [(f"messages[{i}].content[{j}]", p) for j, p in enumerate(content)
                      if isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES]
    return found


def with_placeholders(messages: list[dict[str, Any]], placeholder: str) -> list[dict[str, Any]]:
    """``messages`` with each image part replaced by a text part holding the model's image placeholder."""
    out = []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, list):
            content = [{"type": "text", "text": placeholder}
                       if isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES else p for p in content]
            msg = {**msg, "content": content}
        out.append(msg)
    return out


def _part_bytes(where: str, part: dict[str, Any], limits: ImageLimits) -> bytes:
    if part["type"] == "image":
        data = part.get("data", part.get("image"))
        if not isinstance(data, str):
            raise APIError(400, f"{where}.data must be a base64 string (or a data: URL)", f"{where}.data")
        return _data_or_base64(data, f"{where}.data", limits)
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str):
        raise APIError(400, f"{where}.image_url.url must be a string", f"{where}.image_url.url")
    if url.startswith(("http://", "https://")):
        if not limits.allow_remote:
            raise APIError(400, f"{where}: remote image URLs are refused by this server (send the image as a "
                                "data: URL, or start the server with --allow-remote-images)", f"{where}.image_url.url")
        return _fetch(url, f"{where}.image_url.url", limits)
    if not url.startswith("data:"):
        raise APIError(400, f"{where}.image_url.url must be a data: URL or an http(s) URL, got {url[:40]!r}",
                       f"{where}.image_url.url")
    return _data_or_base64(url, f"{where}.image_url.url", limits)


def _data_or_base64(text: str, param: str, limits: ImageLimits) -> bytes:
    if text.startswith("data:"):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise APIError(400, f"{param}: a data: URL must be 'data:image/<type>;base64,<data>'", param)
        if not header[5:].startswith("image/"):
            raise APIError(400, f"{param}: the data: URL's media type must be image/*, got {header[5:-7]!r}", param)
    if len(text) > (limits.max_bytes + 2) // 3 * 4 + 4:
        raise APIError(400, f"{param}: the image is larger than {limits.max_bytes} bytes", param)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise APIError(400, f"{param}: not valid base64 ({exc})", param) from exc


def _fetch(url: str, param: str, limits: ImageLimits) -> bytes:
    import httpx

    try:
        with httpx.stream("GET", url, timeout=limits.remote_timeout_s, follow_redirects=True) as response:
            if response.status_code != 200:
                raise APIError(400, f"{param}: fetching the image answered HTTP {response.status_code}", param)
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > limits.max_bytes:
                    raise APIError(400, f"{param}: the image is larger than {limits.max_bytes} bytes", param)
            return bytes(data)
    except httpx.HTTPError as exc:
        raise APIError(400, f"{param}: could not fetch the image ({type(exc).__name__}: {exc})", param) from exc


def decode_image(data: bytes, param: str, limits: ImageLimits) -> Any:
    """An RGB ``PIL.Image`` from encoded bytes; its size is checked from the header before any pixel is read."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise APIError(400, f"{param}: the image is larger than {limits.max_bytes} bytes", param)
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > limits.max_pixels:
                raise APIError(400, f"{param}: the image is {width}x{height} pixels, over the bound of "
                                    f"{limits.max_pixels} pixels", param)
            return image.convert("RGB")
    except APIError:
        raise
    except UnidentifiedImageError as exc:
        raise APIError(400, f"{param}: cannot decode the image (not an image format Pillow reads: PNG, JPEG, "
                            "WebP, GIF, BMP, ...)", param) from exc
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise APIError(400, f"{param}: cannot decode the image ({type(exc).__name__}: {exc})", param) from exc


def decode_images(messages: Any, limits: ImageLimits) -> list[Any]:
    """The request's images decoded, in order (an empty list when it has none); a 400 names the bad part."""
    parts = image_parts(messages)
    if len(parts) > limits.max_images:
        where = parts[limits.max_images][0]
        raise APIError(400, f"{where}: {len(parts)} images, over the limit of {limits.max_images} per request",
                       where)
    return [decode_image(_part_bytes(where, part, limits), where, limits) for where, part in parts]


class GridVisionProcessor:
    """Qwen2-VL / Qwen2.5-VL's processor, composed here from the model's Pillow image processor and its
    tokenizer (transformers' own Qwen processors need a video processor, which needs torchvision): the image
    processor resizes each image to a multiple of patch x merge within its pixel bounds and gives its patches and
    grid (t, h, w); each ``<|image_pad|>`` in the text becomes t * h * w / merge^2 of them. Called like a
    transformers processor (``processor(text=[...], images=[...], return_tensors="pt")``)."""

    def __init__(self, model_dir: Path, config: dict[str, Any]) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.image_processor = AutoImageProcessor.from_pretrained(model_dir, backend="pil")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.merge_size = int(self.image_processor.merge_size)
        ids = {key: config.get(key) for key in ("image_token_id", "vision_start_token_id", "vision_end_token_id")}
        missing = [key for key, value in ids.items() if not isinstance(value, int)]
        if missing:
            raise ValueError(f"{model_dir}/config.json has no {', '.join(missing)}")
        self.image_token_id = ids["image_token_id"]
        start, self.image_token, end = self.tokenizer.convert_ids_to_tokens(
            [ids["vision_start_token_id"], ids["image_token_id"], ids["vision_end_token_id"]])
        self.image_placeholder = f"{start}{self.image_token}{end}"  # what the chat template writes per image
        self.chat_template = self.tokenizer.chat_template

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False)

    def tokens_per_image(self, grid_thw: Any) -> list[int]:
        return (grid_thw.prod(-1) // self.merge_size**2).tolist()

    def __call__(self, text: str | list[str], images: list[Any], return_tensors: str = "pt",
                 add_special_tokens: bool = False) -> Any:
        from transformers import BatchFeature

        texts = [text] if isinstance(text, str) else list(text)
        if len(texts) != 1:
            raise ValueError(f"one text per call, got {len(texts)}")
        pieces = texts[0].split(self.image_token)
        if len(pieces) - 1 != len(images):
            raise ValueError(f"the text holds {len(pieces) - 1} {self.image_token!r} for {len(images)} image(s)")
        pixels = self.image_processor(images, return_tensors="pt") if images else {}
        counts = self.tokens_per_image(pixels["image_grid_thw"]) if images else []
        expanded = pieces[0] + "".join(self.image_token * n + rest for n, rest in zip(counts, pieces[1:], strict=True))
        enc = self.tokenizer([expanded], return_tensors="pt", add_special_tokens=add_special_tokens)
        data = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                "mm_token_type_ids": (enc["input_ids"] == self.image_token_id).int()}  # image: 1, text: 0
        if images:
            data.update(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
        return BatchFeature(data, tensor_type=return_tensors)


def load_processor(model_dir: Path) -> Any:
    """A vision-language model's processor: ``GridVisionProcessor`` for the Qwen2-VL image processor, else
    transformers' ``AutoProcessor`` (Pillow image processors where torchvision is missing)."""
    import json

    pre = model_dir / "preprocessor_config.json"
    kind = json.loads(pre.read_text()).get("image_processor_type", "") if pre.exists() else ""
    if kind.startswith("Qwen2VLImageProcessor"):
        return GridVisionProcessor(model_dir, json.loads((model_dir / "config.json").read_text()))
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


class ImageProcessor:
    """A vision-language model's own processor (``load_processor``), loaded on first use: a text with one
    placeholder per image -> token ids with each placeholder expanded, and the images' pixel values (and grids)."""

    def __init__(self, model_dir: Path, image_token_id: int) -> None:
        self.model_dir = model_dir
        self.image_token_id = image_token_id
        self._processor: Any = None
        self._lock = threading.Lock()

    @property
    def processor(self) -> Any:
        with self._lock:
            if self._processor is None:
                self._processor = load_processor(self.model_dir)
            return self._processor

    @property
    def image_token(self) -> str:
        """The text of the image token the processor expands."""
        token = getattr(self.processor, "image_token", None)
        if not isinstance(token, str):
            token = self.processor.tokenizer.convert_ids_to_tokens(self.image_token_id)
        return token

    @property
    def placeholder(self) -> str:
        """The text an image part becomes in the chat: the image token, with the model's image delimiters
        around it where it has them (``<|vision_start|><|image_pad|><|vision_end|>``)."""
        placeholder = getattr(self.processor, "image_placeholder", None)
        return placeholder if isinstance(placeholder, str) else self.image_token

    def __call__(self, text: str, images: list[Any]) -> tuple[list[int], ImageInputs]:
        found = text.count(self.image_token)
        if found != len(images):  # the user's own text held the placeholder too
            raise APIError(400, f"the messages hold {found} image placeholders {self.image_token!r} for "
                                f"{len(images)} image(s): the text must not contain {self.image_token!r}", "messages")
        try:
            out = self.processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
        except ValueError as exc:  # the processor's own checks (an aspect ratio it cannot resize, ...)
            raise APIError(400, f"the model's processor refused the images: {exc}", "messages") from exc
        ids = out["input_ids"][0].tolist()
        inputs = ImageInputs.from_processor(out, ids, self.image_token_id)
        if not inputs.positions:
            raise APIError(400, "the chat template dropped the image placeholders (it does not render image "
                                "parts)", "messages")
        return ids, inputs


def processor_for(model_dir: Path | None, model: Any) -> ImageProcessor | None:
    """The image processor of a model that takes images (None for a text-only model)."""
    if model_dir is None or not getattr(model, "takes_images", False):
        return None
    if not (model_dir / "processor_config.json").exists() and not (model_dir / "preprocessor_config.json").exists():
        raise FileNotFoundError(f"{model_dir}: a vision-language model without processor_config.json")
    return ImageProcessor(model_dir, int(model.image_token_id))
