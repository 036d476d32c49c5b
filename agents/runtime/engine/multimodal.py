"""Per-request image inputs: the processor's pixel values and where their placeholder tokens sit in the prompt.
The features are computed once, the first time a prefill chunk reaches a placeholder, and kept for the request
(its other chunks, a recompute after preemption and the other choices of the same HTTP request reuse them)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class ImageInputs:
    """``pixel_values`` [N, C, H, W]; ``positions``: the prompt positions of the placeholder tokens, in order
    (``tokens_per_image`` per image); ``features`` [len(positions), hidden] once encoded."""

    pixel_values: torch.Tensor
    positions: list[int]
    features: torch.Tensor | None = None

    @classmethod
    def for_prompt(cls, pixel_values: torch.Tensor, prompt_ids: list[int], image_token_id: int) -> ImageInputs:
        return cls(pixel_values, [p for p, t in enumerate(prompt_ids) if t == image_token_id])

    def chunk_rows(self, start: int, n: int) -> tuple[list[int], list[int]]:
        """For the prompt positions [start, start + n): (placeholder offsets within the chunk, feature rows)."""
        lo = bisect.bisect_left(self.positions, start)
        hi = bisect.bisect_left(self.positions, start + n)
        return [self.positions[k] - start for k in range(lo, hi)], list(range(lo, hi))

    def encoded(self, encode: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.features is None:
            features = encode(self.pixel_values)
            if features.shape[0] != len(self.positions):
                raise ValueError(f"the images give {features.shape[0]} feature vectors for "
                                 f"{len(self.positions)} placeholder tokens")
            self.features = features
        return self.features


def config_takes_images(config: dict | None) -> bool:
    """Whether a model's ``config.json`` describes a vision-language model (it has a vision tower's config)."""
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)
