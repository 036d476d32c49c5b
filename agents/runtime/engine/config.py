"""Engine settings, checked once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """``num_blocks`` None: size the KV pool from ``memory_fraction`` of the memory left after the weights
    (default 0.9 on accelerators, 0.25 on a shared CPU host), never more than ``max_num_seqs`` full contexts."""

    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_blocks: int | None = None
    memory_fraction: float | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_pending: int = 1024  # requests waiting or running before add_request refuses more
    compile: bool = False  # the decoder layers compiled with torch.compile (engine/compiled/)
    compile_cache_dir: str | None = None  # Inductor's caches; None: engine.compiled.default_cache_dir()
    pack_weights: bool = False  # dense fp32 CPU weights packed (panels or oneDNN; day0 serve's default on CPU fp32)
    chat_template: str | None = None  # a Jinja chat template's text served instead of the model's own
    # full KV blocks shared between requests by a chained hash of their tokens (``engine/block_manager.py``);
    # ignored on the recompute path (no paged cache)
    enable_prefix_caching: bool = False
    # how an FP8 per-tensor/per-channel release runs (``layers/fp8_native.py``): auto, native (W8A8) or emulated
    quant_mode: str = "auto"

    def __post_init__(self) -> None:
        if self.quant_mode not in ("auto", "native", "emulated"):
            raise ValueError(f"quant_mode must be auto, native or emulated, got {self.quant_mode!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.memory_fraction is not None and not 0.0 < self.memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_pending < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and max_pending must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.pack_weights and self.compile:
            raise ValueError("pack_weights and compile exclude each other (the compiled path traces plain weights)")

    def fraction_for(self, device_type: str) -> float:
        if self.memory_fraction is not None:
            return self.memory_fraction
        return 0.25 if device_type == "cpu" else 0.9
