"""Per-request image inputs: the processor's pixel values and where their placeholder tokens sit in the prompt.
The features are computed once, the first time a prefill chunk reaches a placeholder, and kept for the request
(its other chunks, a recompute after preemption and the other choices of the same HTTP request reuse them).
A recompute path (the transformers fallback) reuses them at every step, and passes ``extra`` (the image grids
of a dynamic-resolution processor) to the model beside them."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from contract.model.spec import config_takes_images  # noqa: F401 (re-exported: defined where config.json is read, torch-free)

# a processor's outputs about the text, not the images
TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


@dataclass
class ImageInputs:
    """``pixel_values``: the processor's pixels ([N, C, H, W], or [patches, C * T * P * P] with a grid);
    ``positions``: the prompt positions of the placeholder tokens, in order (each image's tokens together);
    ``extra``: the processor's other per-image tensors the encoder needs (``image_grid_thw`` [N, 3]);
    ``features`` [len(positions), hidden] once encoded; ``encoder_output``: the model's own encoder output, kept
    beside them by a model that takes it back whole (the fallback: Qwen3-VL's deepstack features ride in it)."""

    pixel_values: torch.Tensor
    positions: list[int]
    features: torch.Tensor | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    encoder_output: Any = None

    @classmethod
    def for_prompt(cls, pixel_values: torch.Tensor, prompt_ids: list[int], image_token_id: int,
                   extra: dict[str, torch.Tensor] | None = None) -> ImageInputs:
        return cls(pixel_values, [p for p, t in enumerate(prompt_ids) if t == image_token_id], extra=dict(extra or {}))

    @classmethod
    def from_processor(cls, out: Any, prompt_ids: list[int], image_token_id: int) -> ImageInputs:
        """From a processor's output: its pixel values, and its other tensors that are not about the text."""
        extra = {k: v for k, v in out.items() if k not in TEXT_KEYS and k != "pixel_values"
                 and isinstance(v, torch.Tensor)}
        return cls.for_prompt(out["pixel_values"], prompt_ids, image_token_id, extra)

    def chunk_rows(self, start: int, n: int) -> tuple[list[int], list[int]]:
        """For the prompt positions [start, start + n): (placeholder offsets within the chunk, feature rows)."""
        lo = bisect.bisect_left(self.positions, start)
        hi = bisect.bisect_left(self.positions, start + n)
        return [self.positions[k] - start for k in range(lo, hi)], list(range(lo, hi))

    def encoded(self, encode: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.features is None:
            features = encode(self.pixel_values, **self.extra)
            if features.shape[0] != len(self.positions):
                raise ValueError(f"the images give {features.shape[0]} feature vectors for "
                                 f"{len(self.positions)} placeholder tokens")
            self.features = features
        return self.features
