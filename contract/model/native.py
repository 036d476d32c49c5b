"""Which code runs an architecture, from its ``config.json`` alone and without torch (the planner and the portal
import this): the native families by ``architectures[0]``, and the config options their layers do not
implement. The runtime's ``models/registry.runtime_path`` decides the same with the native code itself at build
time; the tests hold the two equal over the bundled configs and every option variant they know.

What the answer means for a deployment: a native family runs any TP × PP × EP layout the planner's rules allow
(``planner/search.layout_problem``); the transformers fallback runs on one device only."""

from __future__ import annotations

from typing import Any

# architectures[0] -> module of agents.runtime.models holding its native family
NATIVE_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "LlavaForConditionalGeneration": "llava",
}
# rope_type -> the keys the native frequencies read without a default (``layers/rotary.inv_frequencies``)
NATIVE_ROPE: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (),
}
# a vision-language family -> the decoder model types its native decoder is (``text_config.model_type``)
NATIVE_DECODERS: dict[str, tuple[str, ...]] = {"LlavaForConditionalGeneration": ("llama", "mistral")}
NATIVE_ACTIVATIONS = (None, "silu", "swish")  # the native SwiGLU MLP's (``layers/mlp.check_activation``)
NATIVE_SCORING = (None, "sigmoid", "softmax")  # the native router's
FALLBACK_LAYOUT = "the transformers fallback runs on one device only (tp, pp and ep 1)"


def architecture_of(config: dict[str, Any]) -> str:
    archs = (config.get("architectures") or []) if isinstance(config, dict) else []
    if not archs or not isinstance(archs[0], str):
        raise ValueError("config.json has no 'architectures' list: cannot pick a model family")
    return archs[0]


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """The rope settings as the native rotary reads them (``rope_parameters`` over ``rope_scaling``)."""
    for key in ("rope_scaling", "rope_parameters"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise ValueError(f"{key} must be an object, got {type(config[key]).__name__}")
    params = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def config_gaps(config: dict[str, Any]) -> list[str]:
    """The options in a decoder's ``config`` the native layers do not implement (empty: native), each named."""
    gaps: list[str] = []
    rope = _rope(config)
    kind = rope["rope_type"]
    if kind not in NATIVE_ROPE:
        gaps.append(f"rope_scaling of type {kind!r} (unsupported rope_type {kind!r} (supported: "
                    f"{', '.join(NATIVE_ROPE)}))")
    else:
        missing = [k for k in NATIVE_ROPE[kind] if k not in rope]
        try:
            float(rope["rope_theta"])
        except (TypeError, ValueError):
            missing.append("rope_theta as a number")
        if missing:
            gaps.append(f"rope_scaling of type {kind!r} (missing {', '.join(repr(k) for k in missing)})")
    if config.get("hidden_act") not in NATIVE_ACTIVATIONS:
        gaps.append(f"hidden_act {config.get('hidden_act')!r} (the native MLP is SwiGLU with silu)")
    if config.get("mlp_bias"):
        gaps.append("mlp_bias true (the native MLP has no biases)")
    if config.get("n_routed_experts") and config.get("scoring_func") not in NATIVE_SCORING:
        gaps.append(f"scoring_func {config.get('scoring_func')!r} (the native router scores with sigmoid or softmax)")
    return gaps


def decoder_gap(config: dict[str, Any]) -> str | None:
    """A vision-language family's decoder that its native code is not (LLaVA's is Llama), named; or None."""
    arch = architecture_of(config)
    text = config.get("text_config")
    kind = (text.get("model_type") or "llama") if isinstance(text, dict) else "llama"
    if arch in NATIVE_DECODERS and kind not in NATIVE_DECODERS[arch]:
        return f"text_config.model_type {kind!r} (the native decoder is {' or '.join(NATIVE_DECODERS[arch])})"
    return None


def config_runtime_path(config: dict[str, Any]) -> tuple[str, str | None]:
    """("native", None), or ("fallback", why), from the config alone (see the module docstring)."""
    arch = architecture_of(config)
    if arch not in NATIVE_FAMILIES:
        return "fallback", f"architecture {arch!r} has no native implementation"
    text = config.get("text_config")
    gaps = config_gaps(text if isinstance(text, dict) else config)  # a vision-language model: its decoder's
    decoder = decoder_gap(config)
    if decoder:
        gaps.insert(0, decoder)
    if gaps:
        return "fallback", f"the native {arch} does not implement: {'; '.join(gaps)}"
    return "native", None


def single_device_reason(config: dict[str, Any]) -> str | None:
    """Why only one device can run this model (it runs on the transformers fallback), or None (native: any
    layout within the planner's rules)."""
    path, reason = config_runtime_path(config)
    return f"{reason}: {FALLBACK_LAYOUT}" if path == "fallback" else None
