"""Bytes: dtypes and their weight rule, weight bytes, KV bytes per token, and the memory-model settings.

Weight rule: quantisable linear weights (attention projections, MLPs, experts) take the dtype's bits plus its
scale overhead (``formats.py``: packed values + scales + zero points); embeddings, LM head, norms, biases and routers stay 16-bit under a quantised dtype (as fp8, GPTQ,
AWQ and MXFP4 checkpoints store them) and take the dtype otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.model.params import LayerParams, ParamCount
from contract.model.spec import ModelSpec
from contract.planner.formats import FORMATS, Keep, checkpoint_format, format_bits

GIB = 1 << 30
DTYPES = FORMATS  # canonical dtype -> (bits of quantisable weights, bits of the rest, extra scale bits per weight)
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp8": "float8_e4m3fn",
           "float8": "float8_e4m3fn", "float8_e4m3fnuz": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "w8": "int8",
           "w4": "int4", "int4_awq": "int4", "fp8-tensor": "float8_e4m3fn-tensor",
           "fp8-channel": "float8_e4m3fn-channel", "fp4": "nvfp4", "gguf-q8_0": "q8_0", "gguf-q4_k": "q4_k",
           "gguf-q6_k": "q6_k", "int4-g128": "int4"}


def normalize_dtype(dtype: str) -> str:
    """The canonical dtype name (``int4-gG[-zp]`` for a group size other than 128 or with zero points);
    ValueError naming the dtype and the accepted ones otherwise."""
    name = ALIASES.get(dtype.lower(), dtype.lower()) if isinstance(dtype, str) else ""
    if format_bits(name) is None:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}, int4-gG[-zp] "
                         f"(or {', '.join(ALIASES)})")
    return name


def resolve_dtype(dtype: str, config: dict[str, Any]) -> tuple[str, Keep]:
    """(canonical dtype, what stays 16-bit). ``"auto"`` is the checkpoint's own format: its
    ``quantization_config`` (block/channel FP8, MXFP4, NVFP4, compressed-tensors, GPTQ, AWQ; ``formats.py``) or
    else ``torch_dtype``. Attention stays 16-bit (True) when the quantisation config leaves ``self_attn``
    unconverted (gpt-oss); only the routed experts are quantised (``"experts"``) when it also leaves the dense
    and shared MLPs (Kimi-K2-Thinking)."""
    if dtype != "auto":
        return normalize_dtype(dtype), False
    found = checkpoint_format(config)
    if found is not None:
        return found
    return normalize_dtype(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")), False


def activation_bytes(dtype: str) -> int:
    """Bytes per activation/KV element: fp32 runs in fp32, everything else computes in 16 bits."""
    return 4 if normalize_dtype(dtype) == "float32" else 2


def rest_bits(dtype: str) -> float:
    """Bits of the weights a quantised format leaves alone (embeddings, head, norms, routers)."""
    return format_bits(dtype)[1]


def layer_bits(layer: LayerParams, dtype: str, keep_attention: Keep = False) -> tuple[float, float, float]:
    """Bits of one layer as (tp-sharded, replicated, expert) parts under the dtype's rule."""
    q_bits, rest_bits, scale_bits = format_bits(dtype)
    q = q_bits + scale_bits
    attn = rest_bits if keep_attention else q
    dense = rest_bits if keep_attention == "experts" else q
    return ((layer.attn_sharded * attn + (layer.mlp + layer.shared_experts) * dense),
            layer.attn_replicated * attn + layer.small * rest_bits, layer.experts * q)


def weight_bytes(counts: ParamCount, dtype: str, keep_attention: Keep = False) -> int:
    """Bytes of all weights at ``dtype`` (the rule in the module docstring)."""
    dtype = normalize_dtype(dtype)
    bits = (counts.embedding + counts.lm_head + counts.final_norm + counts.vision) * rest_bits(dtype)
    bits += sum(n * sum(layer_bits(layer, dtype, keep_attention)) for layer, n in counts.kind_counts())
    return int(bits / 8)


def kv_layer_bytes(spec: ModelSpec, kv_bytes: int) -> int:
    """KV bytes one token adds to one layer: ``2 × kv_heads × head_dim`` elements, or MLA's compressed latent
    plus the shared rope key, ``kv_lora_rank + qk_rope_head_dim``."""
    if spec.is_mla:
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_bytes
    return 2 * spec.num_kv_heads * spec.head_dim * kv_bytes


def sliding_layers(spec: ModelSpec) -> int:
    """Layers whose KV is bounded by a sliding window (gpt-oss alternates them with full attention)."""
    if not spec.sliding_window:
        return 0
    if spec.layer_types:
        return sum(1 for kind in spec.layer_types if kind == "sliding_attention")
    return spec.num_layers


def kv_bytes_per_token(spec: ModelSpec, dtype: str = "bfloat16") -> int:
    """KV bytes per token over the full-attention layers: ``2 × layers × kv_heads × head_dim × bytes``, or MLA's
    ``layers × (kv_lora_rank + qk_rope_head_dim) × bytes``. Sliding-window layers cost a constant per sequence."""
    return (spec.num_layers - sliding_layers(spec)) * kv_layer_bytes(spec, activation_bytes(dtype))


@dataclass(frozen=True)
class PlanSettings:
    """Knobs of the memory model (defaults as a serving engine would run)."""

    headroom: float = 0.10
    min_context: int = 4096
    prefill_tokens: int = 8192
    max_seqs: int = 256
    overhead_bytes: int = GIB
    max_nodes: int = 16

    def __post_init__(self) -> None:
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom must be in [0, 1), got {self.headroom}")
        for name in ("min_context", "prefill_tokens", "max_seqs", "max_nodes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
