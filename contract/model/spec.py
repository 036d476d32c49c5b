"""A Hugging Face ``config.json`` parsed into the numbers the planner, loader and models need.

``parse_config(config) -> ModelSpec``. Known families are keyed by ``architectures[0]``; an architecture we do
not know gets ``family="unknown"`` and a warning, and its generic (Llama-like) keys are still parsed when present
so that planning keeps working. Defaults are only the ones ``transformers`` itself applies (``num_key_value_heads``
= heads, ``head_dim`` = hidden / heads, ``tie_word_embeddings`` false); a missing required key raises
``SpecError`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.model.vision_params import count_vision_params

# transformers builds q/k/v projections with biases (o_proj without) for these, whatever the config says
QKV_BIAS_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"})

# decoders with per-head q/k RMSNorms outside the native Qwen3 families (the Qwen3-VL text models)
QK_NORM_MODEL_TYPES = frozenset({"qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"})

FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
}
FAMILY_NAMES = frozenset(FAMILIES.values()) | {"unknown"}
ROPE_TYPES = frozenset({"default", "linear", "dynamic", "llama3", "yarn", "longrope", "ntk"})


def config_takes_images(config: dict[str, Any] | None) -> bool:
    """Whether a model's ``config.json`` describes a vision-language model (it has a vision tower's config).
    Torch-free, so the portal asks it too (a release records the image modality from it)."""
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


class SpecError(ValueError):
    """A config that cannot be turned into a ModelSpec; the message names the missing or bad key."""


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer. Expert fields are zero for dense models, MLA fields zero
    unless ``kv_lora_rank`` is set. ``moe_layers`` lists the layer indices whose MLP is a routed MoE."""

    architecture: str
    family: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    context_length: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qkv_bias: bool = False  # biases on q, k and v only (the Qwen2 family, whose configs do not say so)
    mlp_bias: bool = False
    qk_norm: bool = False
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_scaling: dict[str, Any] | None = None
    torch_dtype: str | None = None
    # mixture of experts
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    moe_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    score_correction_bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    scoring_func: str = "softmax"
    topk_method: str = "greedy"
    # multi-head latent attention (DeepSeek-V3, Kimi-K2)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # attention extras (gpt-oss)
    attention_sinks: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    num_mtp_layers: int = 0
    quantization: dict[str, Any] | None = None
    vision_params: int = 0  # a vision-language model's vision tower and projector (``vision_params.py``)
    warnings: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.family not in FAMILY_NAMES:
            raise SpecError(f"family {self.family!r} is not one of {sorted(FAMILY_NAMES)}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_kv_heads",
                     "context_length"):
            if getattr(self, name) <= 0:
                raise SpecError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.is_mla and self.head_dim <= 0:
            raise SpecError(f"head_dim must be positive, got {self.head_dim}")
        if self.num_attention_heads % self.num_kv_heads:
            raise SpecError(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                            f"num_key_value_heads ({self.num_kv_heads})")
        if self.intermediate_size <= 0 and len(self.moe_layers) < self.num_layers:
            raise SpecError("intermediate_size must be positive: the model has dense MLP layers")
        if self.num_experts:
            if not 0 < self.num_experts_per_tok <= self.num_experts:
                raise SpecError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be in 1..num_experts "
                                f"({self.num_experts})")
            if self.moe_intermediate_size <= 0:
                raise SpecError("moe_intermediate_size must be positive for a mixture of experts")
            if self.num_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
                raise SpecError(f"n_group ({self.n_group}) must divide the experts ({self.num_experts}) and "
                                f"topk_group ({self.topk_group}) must be in 1..n_group")
        if any(not 0 <= i < self.num_layers for i in self.moe_layers):
            raise SpecError(f"moe layer indices must lie in 0..{self.num_layers - 1}")
        if self.moe_layers and not self.num_experts:
            raise SpecError("moe_layers given but the model has no experts")
        if self.is_mla:
            for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name) <= 0:
                    raise SpecError(f"{name} must be positive for multi-head latent attention")
            if self.q_lora_rank is not None and self.q_lora_rank <= 0:
                raise SpecError(f"q_lora_rank must be positive or null, got {self.q_lora_rank}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise SpecError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def dense_layers(self) -> tuple[int, ...]:
        moe = set(self.moe_layers)
        return tuple(i for i in range(self.num_layers) if i not in moe)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the plan section's ``spec``)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["moe_layers"] = len(self.moe_layers)
        out["layer_types"] = list(self.layer_types)
        out["warnings"] = list(self.warnings)
        return out


def _req(cfg: dict[str, Any], *keys: str) -> Any:
    """The first present key among aliases, else SpecError naming the first."""
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    raise SpecError(f"config is missing required key {keys[0]!r}")


def _int(cfg: dict[str, Any], key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise SpecError(f"config key {key!r} must be an integer, got {value!r}")
    return int(value)


def _rope(cfg: dict[str, Any]) -> tuple[float, str, dict[str, Any] | None]:
    """rope_theta, rope_type and the scaling dict, from the 4.x keys (rope_theta, rope_scaling) or the 5.x
    ``rope_parameters``."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or None
    if scaling is None and params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    rope_type = "default"
    if scaling:
        rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type == "mrope":  # Qwen2-VL's M-RoPE: the default frequencies split over (time, height, width)
            rope_type = "default"
        if rope_type not in ROPE_TYPES:
            raise SpecError(f"rope_scaling.rope_type {rope_type!r} is not one of {sorted(ROPE_TYPES)}")
        if rope_type != "default" and "factor" not in scaling:
            raise SpecError(f"rope_scaling of type {rope_type!r} is missing 'factor'")
        if rope_type == "llama3":
            for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                if key not in scaling:
                    raise SpecError(f"rope_scaling of type 'llama3' is missing {key!r}")
        if rope_type == "default":
            scaling = None
    return float(theta), rope_type, scaling


def _moe_layers(cfg: dict[str, Any], family: str, num_layers: int, num_experts: int) -> tuple[int, ...]:
    if not num_experts:
        return ()
    if family == "deepseek_v3":  # DeepSeek's own code; transformers ignores moe_layer_freq (1 in every release)
        first = _int(cfg, "first_k_dense_replace", cfg.get("first_k_dense_replace", 0))
        freq = _int(cfg, "moe_layer_freq", cfg.get("moe_layer_freq", 1))
        return tuple(i for i in range(num_layers) if i >= first and i % max(freq, 1) == 0)
    if family == "qwen3_moe":
        step = _int(cfg, "decoder_sparse_step", cfg.get("decoder_sparse_step", 1))
        only = set(cfg.get("mlp_only_layers") or [])
        return tuple(i for i in range(num_layers) if i not in only and (i + 1) % max(step, 1) == 0)
    return tuple(range(num_layers))


def parse_config(config: dict[str, Any]) -> ModelSpec:
    """Parse a Hugging Face ``config.json`` dict into a ModelSpec (see the module docstring)."""
    if not isinstance(config, dict):
        raise SpecError(f"config must be a JSON object, got {type(config).__name__}")
    archs = config.get("architectures")
    if not archs or not isinstance(archs, list) or not isinstance(archs[0], str):
        raise SpecError("config is missing required key 'architectures' (a list naming the model class)")
    architecture = archs[0]
    family = FAMILIES.get(architecture, "unknown")
    warnings: list[str] = []
    cfg = config
    if family == "unknown":
        warnings.append(f"architecture {architecture!r} is not a known family; planned from its generic keys")
        if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
            cfg = {**cfg["text_config"], "architectures": archs}
            warnings.append("parsed the nested 'text_config' (a multimodal model's language part)")

    hidden = _int(cfg, "hidden_size", _req(cfg, "hidden_size", "n_embd", "d_model"))
    layers = _int(cfg, "num_hidden_layers", _req(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = _int(cfg, "num_attention_heads", _req(cfg, "num_attention_heads", "n_head"))
    kv_heads = _int(cfg, "num_key_value_heads", cfg.get("num_key_value_heads") or heads)
    vocab = _int(cfg, "vocab_size", _req(cfg, "vocab_size"))
    context = _int(cfg, "max_position_embeddings", _req(cfg, "max_position_embeddings", "n_positions",
                                                          "seq_length"))
    head_dim = _int(cfg, "head_dim", cfg.get("head_dim") or (hidden // heads if heads else 0))
    theta, rope_type, scaling = _rope(cfg)

    num_experts = _int(cfg, "num_experts", cfg.get("n_routed_experts") or cfg.get("num_local_experts")
                       or cfg.get("num_experts") or 0)
    moe_fields: dict[str, Any] = {}
    if num_experts:
        topk = _int(cfg, "num_experts_per_tok", _req(cfg, "num_experts_per_tok", "experts_per_token"))
        moe_fields = {"num_experts": num_experts, "num_experts_per_tok": topk,
                      "moe_layers": _moe_layers(cfg, family, layers, num_experts),
                      "norm_topk_prob": bool(cfg.get("norm_topk_prob", family in ("mixtral", "gpt_oss")))}
    if family in ("mixtral", "gpt_oss") or (family == "unknown" and num_experts and "moe_intermediate_size"
                                            not in cfg):
        inter = _int(cfg, "intermediate_size", _req(cfg, "intermediate_size"))
        if num_experts:
            moe_fields["moe_intermediate_size"] = inter
    else:
        inter = _int(cfg, "intermediate_size", cfg.get("intermediate_size") or 0)
        if num_experts:
            moe_fields["moe_intermediate_size"] = _int(cfg, "moe_intermediate_size",
                                                       _req(cfg, "moe_intermediate_size"))
    if family in ("llama", "qwen3", "unknown") and not num_experts and not inter:
        inter = _int(cfg, "intermediate_size", _req(cfg, "intermediate_size"))

    extra: dict[str, Any] = {}
    if family == "deepseek_v3" or (family == "unknown" and cfg.get("kv_lora_rank")):
        q_lora = cfg.get("q_lora_rank")
        extra = {
            "q_lora_rank": None if q_lora is None else _int(cfg, "q_lora_rank", q_lora),
            "kv_lora_rank": _int(cfg, "kv_lora_rank", _req(cfg, "kv_lora_rank")),
            "qk_nope_head_dim": _int(cfg, "qk_nope_head_dim", _req(cfg, "qk_nope_head_dim")),
            "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim", _req(cfg, "qk_rope_head_dim")),
            "v_head_dim": _int(cfg, "v_head_dim", _req(cfg, "v_head_dim")),
            "num_mtp_layers": _int(cfg, "num_nextn_predict_layers", cfg.get("num_nextn_predict_layers") or 0),
        }
        head_dim = extra["qk_nope_head_dim"] + extra["qk_rope_head_dim"]
        kv_heads = heads  # MLA expands the latent to every head; transformers requires the two to be equal
        if num_experts:
            extra.update(
                num_shared_experts=_int(cfg, "n_shared_experts", cfg.get("n_shared_experts") or 0),
                n_group=_int(cfg, "n_group", cfg.get("n_group") or 1),
                topk_group=_int(cfg, "topk_group", cfg.get("topk_group") or 1),
                routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
                scoring_func=str(cfg.get("scoring_func", "sigmoid")),
                topk_method=str(cfg.get("topk_method", "noaux_tc")),
                # transformers always builds the correction bias; it is in every V3 checkpoint
                score_correction_bias=True,
            )
    if family == "gpt_oss":
        types = tuple(cfg.get("layer_types") or ())
        extra.update(attention_sinks=True, router_bias=True, expert_bias=True, layer_types=types,
                     sliding_window=cfg.get("sliding_window"))
    elif cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        extra["sliding_window"] = _int(cfg, "sliding_window", cfg["sliding_window"])

    torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    return ModelSpec(
        architecture=architecture, family=family, model_type=str(cfg.get("model_type", "")), vocab_size=vocab,
        hidden_size=hidden, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=inter, context_length=context,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", cfg.get("qkv_bias", False))),
        qkv_bias="attention_bias" not in cfg and str(cfg.get("model_type", "")) in QKV_BIAS_MODEL_TYPES,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=family in ("qwen3", "qwen3_moe") or str(cfg.get("model_type", "")) in QK_NORM_MODEL_TYPES,
        rope_theta=theta, rope_type=rope_type, rope_scaling=scaling,
        torch_dtype=str(torch_dtype) if torch_dtype else None, quantization=cfg.get("quantization_config"),
        vision_params=count_vision_params(config), warnings=tuple(warnings), **moe_fields, **extra,
    )
