"""The model the operator inventory traces, and the steps it runs.

The trace runs the bundled runtime's own model (native family or the transformers fallback behind the runtime
interface): the one the load stage left in ``ctx.state.model`` when there is one, else built from the config with
fixed random weights on the target device when it fits comfortably in memory, else on the ``meta`` device (no
weights, no data). One paged prefill of ``PREFILL_TOKENS`` tokens and one decode step are traced.

Only a model on the fallback path may be traced through ``transformers`` directly (``transformers_steps``), and
the section says so: for a native model that trace would describe code the runtime does not run."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.models import paged_context
from agents.pipeline.support.op_capture import OperatorRecorder

PREFILL_TOKENS = 8
BLOCK_SIZE = 16
# a model whose weights exceed this (or a quarter of free memory on the device) is traced on the meta device
REAL_TRACE_MAX_BYTES = 2 * 1024**3


def device_usable(device: str) -> bool:
    """Whether tensors can be allocated on ``device`` here (a CUDA target on a CPU host cannot)."""
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError):
        return False
    return True


def free_memory_bytes(device: str) -> int:
    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 1024**3


def runtime_model(config: dict[str, Any], dtype: torch.dtype, device: str) -> tuple[Any, str, int]:
    """(the runtime's model with fixed random weights, the device it is on, its weight bytes): on ``device``
    when it fits, else on ``meta``. A config the runtime cannot build is a StageFailed naming why."""
    from agents.runtime.models.registry import build_model

    try:
        meta = build_model(config, dtype=dtype, device="meta")
    except (ValueError, NotImplementedError, KeyError) as exc:
        raise StageFailed(f"the runtime cannot build this model for the operator trace: {exc}") from exc
    n_bytes = sum(p.numel() * p.element_size() for p in meta.parameters())
    free = free_memory_bytes(device) if device_usable(device) else 0
    if n_bytes > min(REAL_TRACE_MAX_BYTES, free // 4):
        return meta, "meta", n_bytes
    del meta
    model = build_model(config, dtype=dtype, device=device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * 0.02
            param.copy_(values.to(param.dtype))
    return model, device, n_bytes


def probe_pixels(model: Any, device: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One random image of a vision-language model's vision tower input size: (pixels [1, C, H, W], {}), or the
    model's own probe (``probe_image_inputs``: a dynamic-resolution tower's patches and grid)."""
    if hasattr(model, "probe_image_inputs"):
        return model.probe_image_inputs(device)
    vision = model.vlm_config["vision_config"]
    side, channels = int(vision["image_size"]), int(vision.get("num_channels", 3))
    pixels = torch.randn((1, channels, side, side), generator=torch.Generator().manual_seed(0))
    return pixels.to(device=device, dtype=model.dtype), {}


def runtime_steps(model: Any, device: str, vocab: int, recorder: OperatorRecorder) -> None:
    """One paged prefill of ``PREFILL_TOKENS`` tokens and one decode step of the runtime model (a model
    without a paged cache recomputes the whole sequence for its decode step). On meta the batch layout stays
    on the CPU: the engine reads it on the host anyway."""
    layout = "cpu" if torch.device(device).type == "meta" else device
    spec = model.kv_cache_spec()
    n_blocks = (PREFILL_TOKENS + 1) // BLOCK_SIZE + 2
    if spec is not None:
        tail = (spec.num_kv_heads, spec.head_dim) if spec.kind == "kv" else (spec.latent_dim,)
        per_layer = 2 if spec.kind == "kv" else 1
        model.bind_kv_cache([
            tuple(torch.zeros((n_blocks, BLOCK_SIZE, *tail), dtype=spec.dtype, device=device) for _ in range(per_layer))
            for _ in range(spec.num_layers)
        ])
    ids = torch.randint(0, vocab, (PREFILL_TOKENS,), generator=torch.Generator().manual_seed(0)).to(device)  # [T]

    def step(tokens: torch.Tensor, start: int) -> torch.Tensor:
        n = int(tokens.shape[0])
        if spec is not None:
            ctx = paged_context(start, n, n_blocks, layout)
        else:
            from agents.runtime.context import ForwardContext

            ctx = ForwardContext.for_prompts([n], device=layout)
        positions = torch.arange(start, start + n, dtype=torch.int64, device=device)  # [T]
        out = model.forward(tokens, positions, ctx, **({"images": [images]} if images is not None else {}))
        return model.compute_logits(out.hidden[-1:])  # [1, vocab]

    pixels = probe_pixels(model, device) if getattr(model, "takes_images", False) else None
    images = None
    if pixels is not None and spec is None:  # the recompute path: image tokens in the prompt, features spliced
        if torch.device(device).type == "meta":
            pixels = None  # its grids are read on the host: nothing to read on meta
        else:
            from agents.runtime.engine.multimodal import ImageInputs

            n_image = int(model.encode_images(pixels[0], **pixels[1]).shape[0])  # outside the trace: the count
            image_ids = torch.full((n_image,), int(model.image_token_id), dtype=ids.dtype, device=ids.device)
            ids = torch.cat([image_ids, torch.where(ids == model.image_token_id, 0, ids)])  # [K + T]
            images = ImageInputs(pixels[0], list(range(n_image)), extra=dict(pixels[1]))
    with torch.no_grad(), recorder:
        recorder.phase = "prefill"
        if pixels is not None and images is None:  # the image path runs at prefill: vision tower + projector
            model.encode_images(pixels[0], **pixels[1])
        logits = step(ids, 0)  # the recompute path encodes its images here, once
        recorder.phase = "decode"
        next_id = (logits.argmax(-1) if not logits.is_meta else ids[-1:]).to(ids.dtype)
        if spec is None:
            step(torch.cat([ids, next_id]), 0)
        else:
            step(next_id, int(ids.shape[0]))


def transformers_model(config: dict[str, Any], dtype: torch.dtype, device: str) -> torch.nn.Module:
    """``transformers``' own model for the config (random weights), for a model on the fallback path."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise StageFailed("config.json has no 'model_type': transformers cannot build the model")
    try:
        hf_config = AutoConfig.for_model(model_type, **cfg)
    except (KeyError, ValueError) as exc:
        raise StageFailed(f"transformers does not know model_type {model_type!r}: {exc}") from exc
    kwargs: dict[str, Any] = {"dtype": dtype}
    if torch.device(device).type == "meta":
        kwargs["experts_implementation"] = "eager"  # grouped_mm's meta kernel accepts bf16 only
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
        except (TypeError, ValueError):
            kwargs.pop("experts_implementation", None)
            model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
    return model.eval()


def transformers_steps(model: torch.nn.Module, device: str, vocab: int, recorder: OperatorRecorder) -> None:
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.randint(0, vocab, (1, PREFILL_TOKENS), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad(), recorder:
        recorder.phase = "prefill"
        out = model(input_ids=ids, use_cache=True)
        recorder.phase = "decode"
        next_id = ids[:, -1:] if out.logits.is_meta else out.logits[:, -1:].argmax(-1)  # [1, 1]
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        model(input_ids=next_id, use_cache=True, **{cache_kw: cache})
