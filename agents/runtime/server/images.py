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


class ImageProcessor:
    """A vision-language model's own processor (``AutoProcessor`` from its directory, with the Pillow image
    processor), loaded on first use: a text with one placeholder per image -> token ids with each placeholder
    expanded, and the images' pixel values."""

    def __init__(self, model_dir: Path, image_token_id: int) -> None:
        self.model_dir = model_dir
        self.image_token_id = image_token_id
        self._processor: Any = None
        self._lock = threading.Lock()

    @property
    def processor(self) -> Any:
        with self._lock:
            if self._processor is None:
                from transformers import AutoProcessor

                self._processor = AutoProcessor.from_pretrained(self.model_dir)
            return self._processor

    @property
    def placeholder(self) -> str:
        """The text of the image token the chat template and the processor expect."""
        token = getattr(self.processor, "image_token", None)
        if not isinstance(token, str):
            token = self.processor.tokenizer.convert_ids_to_tokens(self.image_token_id)
        return token

    def __call__(self, text: str, images: list[Any]) -> tuple[list[int], ImageInputs]:
        found = text.count(self.placeholder)
        if found != len(images):  # the user's own text held the placeholder too
            raise APIError(400, f"the messages hold {found} image placeholders {self.placeholder!r} for "
                                f"{len(images)} image(s): the text must not contain {self.placeholder!r}", "messages")
        out = self.processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
        ids = out["input_ids"][0].tolist()
        inputs = ImageInputs.for_prompt(out["pixel_values"], ids, self.image_token_id)
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
