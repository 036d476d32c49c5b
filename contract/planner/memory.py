"""Bytes: dtypes and their weight rule, weight bytes, KV bytes per token, and the memory-model settings.

Weight rule: quantisable linear weights (attention projections, MLPs, experts) take the dtype's bits plus its
scale overhead; embeddings, LM head, norms, biases and routers stay 16-bit under a quantised dtype (as fp8, GPTQ,
AWQ and MXFP4 checkpoints store them) and take the dtype otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.model.params import LayerParams, ParamCount
from contract.model.spec import ModelSpec

GIB = 1 << 30
# canonical dtype -> (bits of quantisable weights, bits of the rest, extra scale bits per quantised weight)
DTYPES: dict[str, tuple[float, float, float]] = {
    "float32": (32, 32, 0.0),
    "bfloat16": (16, 16, 0.0),
    "float16": (16, 16, 0.0),
    "float8_e4m3fn": (8, 16, 32 / (128 * 128)),  # one fp32 scale per 128×128 block (DeepSeek-V3 layout)
    "int8": (8, 16, 0.0),  # per-output-channel scales: negligible
    "int4": (4, 16, 16 / 128),  # one 16-bit scale per group of 128 weights (GPTQ/AWQ layout)
    "mxfp4": (4, 16, 8 / 32),  # OCP microscaling: one 8-bit exponent per block of 32 (gpt-oss experts)
}
QUANT_METHODS = {"fp8": "float8_e4m3fn", "fbgemm_fp8": "float8_e4m3fn", "mxfp4": "mxfp4"}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp8": "float8_e4m3fn",
           "float8": "float8_e4m3fn", "float8_e4m3fnuz": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "w8": "int8",
           "w4": "int4", "int4_awq": "int4"}


def normalize_dtype(dtype: str) -> str:
    """The canonical dtype name; ValueError naming the dtype and the accepted ones otherwise."""
    name = ALIASES.get(dtype.lower(), dtype.lower()) if isinstance(dtype, str) else ""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)} (or {', '.join(ALIASES)})")
    return name


def resolve_dtype(dtype: str, config: dict[str, Any]) -> tuple[str, bool]:
    """(canonical dtype, whether attention stays 16-bit). ``"auto"`` is the checkpoint's own format: its
    ``quantization_config`` (fp8, mxfp4, 4/8-bit GPTQ/AWQ) or else ``torch_dtype``. Attention stays 16-bit when
    the quantisation config leaves ``self_attn`` unconverted (gpt-oss)."""
    quant = config.get("quantization_config") or {}
    if dtype != "auto":
        return normalize_dtype(dtype), False
    keep_attention = any("self_attn" in str(m) for m in quant.get("modules_to_not_convert") or [])
    method = str(quant.get("quant_method", "")).lower()
    if method in QUANT_METHODS:
        return QUANT_METHODS[method], keep_attention
    if quant.get("bits") in (4, 8):
        return ("int4" if quant["bits"] == 4 else "int8"), keep_attention
    return normalize_dtype(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")), False


def activation_bytes(dtype: str) -> int:
    """Bytes per activation/KV element: fp32 runs in fp32, everything else computes in 16 bits."""
    return 4 if normalize_dtype(dtype) == "float32" else 2


def layer_bits(layer: LayerParams, dtype: str, keep_attention: bool = False) -> tuple[float, float, float]:
    """Bits of one layer as (tp-sharded, replicated, expert) parts under the dtype's rule."""
    q_bits, rest_bits, scale_bits = DTYPES[dtype]
    q = q_bits + scale_bits
    attn = rest_bits if keep_attention else q
    return ((layer.attn_sharded * attn + (layer.mlp + layer.shared_experts) * q),
            layer.attn_replicated * attn + layer.small * rest_bits, layer.experts * q)


def weight_bytes(counts: ParamCount, dtype: str, keep_attention: bool = False) -> int:
    """Bytes of all weights at ``dtype`` (the rule in the module docstring)."""
    dtype = normalize_dtype(dtype)
    rest_bits = DTYPES[dtype][1]
    bits = (counts.embedding + counts.lm_head + counts.final_norm + counts.vision) * rest_bits
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
