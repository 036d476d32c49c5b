"""One request as the engine sees it: tokens, cache blocks, progress and timing."""

from __future__ import annotations

import enum
import time

import torch

from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Prompt plus generated tokens. ``num_computed_tokens`` counts tokens whose K/V sit in the cache; after a
    preemption it drops to 0 and the whole sequence (prompt and outputs so far) is recomputed."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        # prefix caching (``engine/block_manager.py``): chained hashes of the full blocks, their root (the images'
        # hash), how many of the table's blocks are named in the cache, and the prompt tokens found cached
        self.block_hashes: list[bytes] = []
        self.prefix_root = b""
        self.num_registered_blocks = 0
        self.num_cached_tokens = 0
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.isolate = False  # run alone: it was in a batch whose forward pass failed
        self.num_failures = 0
        self.arrival_time = time.monotonic()
        self.first_scheduled_time: float | None = None  # left the waiting queue (its queue time ends)
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.generator: torch.Generator | None = None
        self.images: ImageInputs | None = None  # a vision-language prompt's images (``engine/multimodal.py``)
        self.matcher = None  # the grammar matcher of a constrained request (``engine/grammar.py``)
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        # prompt logprobs filled position by position as prefill chunks run (position 0 has none)
        self.prompt_logprobs: list | None = [None] if params.prompt_logprobs is not None else None
        self.prompt_logprobs_sent = False
        # incremental detokenisation state (owned by the engine's detokenizer)
        self.text = ""
        self.prefix_offset = max(0, len(prompt_token_ids) - 6)
        self.read_offset = len(prompt_token_ids)
        self.emitted_text_len = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def append_token(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.token_ids.append(token_id)

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.finish_time = time.monotonic()

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, status={self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
