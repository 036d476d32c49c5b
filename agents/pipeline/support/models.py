"""What the align, eval, serve and reference stages share: the reference (``transformers`` fp32 on CPU, same
weights), the target (our runtime model on the job's device and dtype), the tokenizer and the model's
end-of-sequence ids, align thresholds, and batched forwards on both. Each model is made once per job and kept in
``ctx.state``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.vision_reference import reference_decoder
from agents.runtime.context import ForwardContext
from agents.runtime.engine.multimodal import config_takes_images
from agents.runtime.layers.int_quant import int_format
from agents.runtime.loader import LoadError
from agents.runtime.loader.gguf_release import gguf_files_kwargs
from agents.runtime.loader.int_release import dequantized_state
from agents.runtime.loader.quant_reference import dequantized_reference
from contract.planner.formats import hardware_declares
from contract.thresholds import ALIGN as ALIGN_THRESHOLDS

# contract.thresholds defaults (every dtype), overridable per job through ctx.thresholds.
DEFAULT_THRESHOLDS: dict[str, float] = ALIGN_THRESHOLDS


def align_thresholds(ctx: StageContext) -> dict[str, float]:
    """The defaults overlaid with the job's overrides (unknown keys are kept: other checks may read them)."""
    merged = dict(DEFAULT_THRESHOLDS)
    merged.update({k: float(v) for k, v in ctx.thresholds.items()})
    return merged


def target_model(ctx: StageContext) -> Any:
    """Our runtime model: the one the load stage left in ``ctx.state.model``, else loaded now."""
    model = ctx.state.model
    if model is not None:
        return model
    if ctx.model_dir is None:
        raise StageFailed(f"{ctx.current_stage} needs the model's weights, but this job has no model directory")
    from agents.runtime.loader import LoadError, load_model

    try:
        result = load_model(ctx.model_dir, dtype=ctx.dtype, device=ctx.device, quant_mode=ctx.quant_mode,
                            hardware_declares=hardware_declares(ctx.config, (ctx.hardware or {}).get("dtypes")))
    except LoadError as exc:
        raise StageFailed(f"cannot load the target model: {exc}") from exc
    ctx.state.model = result.model
    return result.model


def fp32_target(ctx: StageContext) -> Any:
    """The runtime model in fp32 on the job's device: the target itself when it is fp32, else loaded once and
    kept in ``ctx.state.model_fp32`` (the layer report and the KV-cache check share it)."""
    model = ctx.state.model_fp32
    if model is not None:
        return model
    target = ctx.state.model
    first = next(iter(target.parameters()), None) if hasattr(target, "parameters") else None
    if first is not None and first.dtype == torch.float32:
        return target
    if ctx.model_dir is None:
        raise StageFailed(f"{ctx.current_stage} needs the model's weights in fp32, but this job has no model directory")
    from agents.runtime.loader import LoadError, load_model

    try:
        model = load_model(ctx.model_dir, dtype="float32", device=ctx.device, stats=False, quant_mode=ctx.quant_mode,
                           hardware_declares=hardware_declares(ctx.config, (ctx.hardware or {}).get("dtypes"))).model
    except LoadError as exc:
        raise StageFailed(f"cannot load the model in fp32: {exc}") from exc
    ctx.state.model_fp32 = model
    return model


def check_reference_fits(ctx: StageContext) -> None:
    """The fp32 reference must fit in this host's available memory; say so up front rather than swap or die."""
    params = (ctx.results.get("plan") or {}).get("params_total")
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return
    match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.M)
    if not params or not match:
        return
    need, available = int(params) * 4, int(match.group(1)) * 1024
    if need > 0.9 * available:
        raise StageFailed(f"the transformers fp32 reference needs {need / 2**30:.1f} GiB, "
                          f"this host has {available / 2**30:.1f} GiB available")


def reference_model(ctx: StageContext) -> nn.Module:
    """``transformers``' own implementation in fp32 on CPU, loaded from the same checkpoint (cached)."""
    ref = ctx.state.reference_model
    if ref is not None:
        return ref
    if ctx.model_dir is None:
        raise StageFailed(f"{ctx.current_stage} needs the model's weights, but this job has no model directory")
    check_reference_fits(ctx)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if config_takes_images(ctx.config):  # the text checks run on the reference's own decoder
        ref = reference_decoder(ctx)
        ctx.state.reference_model = ref
        return ref
    try:
        if int_format(ctx.config) is not None:  # integer weights: transformers on the dequantised numbers
            ref = _dequantized_reference(ctx)
        else:  # a quantised release (MXFP4, NVFP4, FP8 per tensor/channel): its weights dequantised in fp32
            ref = dequantized_reference(ctx.model_dir, ctx.config)
            if ref is None:
                ref = AutoModelForCausalLM.from_pretrained(ctx.model_dir, dtype=torch.float32,
                                                           **gguf_files_kwargs(ctx.model_dir))
    except (ValueError, OSError, KeyError, LoadError) as exc:
        raise StageFailed(f"the transformers reference cannot load {ctx.model_dir}: {exc}") from exc
    ref.eval()
    ctx.state.reference_model = ref
    return ref


def _dequantized_reference(ctx: StageContext) -> nn.Module:
    """transformers' model of an integer-format release (compressed-tensors, GPTQ, AWQ) built unquantised and
    given the dequantised weights (``int_release.dequantized_state``): the same numbers in fp32, so operators,
    layers and tokens compare the runtime's kernels, not the quantisation (which the eval against the
    unquantised original measures). transformers' GPTQ and AWQ loaders need CUDA kernels; this needs none."""
    from transformers import AutoConfig, AutoModelForCausalLM

    plain = {k: v for k, v in ctx.config.items() if k != "quantization_config"}
    config = AutoConfig.for_model(plain.pop("model_type"), **plain)
    ref = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = dequantized_state(ctx.model_dir, ctx.config, int_format(ctx.config))
    missing, unexpected = ref.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"the dequantised reference does not match transformers' model: missing "
                         f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
    if tied:
        ref.tie_weights()
    return ref


def tokenizer(ctx: StageContext) -> Any | None:
    """The model's own tokenizer, or None when the checkpoint ships none (cached)."""
    if ctx.state.tokenizer_loaded:
        return ctx.state.tokenizer
    tok = None
    gguf = gguf_files_kwargs(ctx.model_dir)  # a GGUF release carries its tokenizer in its metadata
    if ctx.model_dir is not None and (gguf or any((ctx.model_dir / n).exists()
                                                  for n in ("tokenizer.json", "tokenizer.model"))):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(ctx.model_dir, **gguf)
    ctx.state.tokenizer, ctx.state.tokenizer_loaded = tok, True
    return tok


def eos_token_ids(ctx: StageContext) -> set[int]:
    """The model's end-of-sequence ids: ``config.json``, ``generation_config.json`` and the tokenizer's."""
    ids: set[int] = set()

    def add(value: Any) -> None:
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool):
                ids.add(v)

    add(ctx.config.get("eos_token_id"))
    gen = ctx.model_dir / "generation_config.json" if ctx.model_dir is not None else None
    if gen is not None and gen.is_file():
        try:
            add(json.loads(gen.read_text()).get("eos_token_id"))
        except (OSError, ValueError, AttributeError):
            pass
    tok = tokenizer(ctx)
    if tok is not None:
        add(getattr(tok, "eos_token_id", None))
    return ids


def vocab_size(ctx: StageContext) -> int:
    return int(ctx.config.get("vocab_size") or ctx.config.get("text_config", {}).get("vocab_size"))


def encode(ctx: StageContext, texts: list[str], *, chat: tuple[bool, ...] = ()) -> tuple[list[list[int]], list[str]]:
    """Token ids of ``texts`` with the model's tokenizer (chat-rendered where ``chat[i]`` and the tokenizer has a
    template). Without a tokenizer: fixed pseudo-random ids, and a note saying so."""
    tok = tokenizer(ctx)
    notes: list[str] = []
    if tok is None:
        gen = torch.Generator().manual_seed(1234)
        notes.append("the checkpoint has no tokenizer: prompts are fixed pseudo-random token ids")
        return [torch.randint(4, vocab_size(ctx), (12,), generator=gen).tolist() for _ in texts], notes
    seqs: list[list[int]] = []
    for i, text in enumerate(texts):
        if i < len(chat) and chat[i] and getattr(tok, "chat_template", None):
            rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=False)
            seqs.append(list(tok(rendered, add_special_tokens=False)["input_ids"]))
        else:
            seqs.append(list(tok(text)["input_ids"]))
    return seqs, notes


def decode_token(ctx: StageContext, token: int) -> str:
    tok = tokenizer(ctx)
    return tok.decode([token]) if tok is not None else str(token)


def decoder_layers(model: nn.Module, num_layers: int) -> nn.ModuleList:
    """The reference's list of decoder blocks (the ModuleList with the configured number of layers), inside its
    decoder where it names one (a vision tower's blocks may have the same count)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for module in (decoder if isinstance(decoder, nn.Module) else model).modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers:
            return module
    raise StageFailed(f"cannot find the {num_layers} decoder layers in the reference {type(model).__name__}")


def _device_of(model: Any, ctx: StageContext) -> torch.device:
    return torch.device(getattr(model, "device", None) or ctx.device)


@torch.inference_mode()
def target_forward(
    ctx: StageContext, model: Any, seqs: list[list[int]], *, hidden_states: bool = False
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """One flattened no-cache forward of every sequence on the target. Returns per-sequence logits [L, V]
    (fp32, CPU) and, when asked, per-layer hidden states [T, hidden] (fp32, CPU, sequences concatenated)."""
    device = _device_of(model, ctx)
    lengths = [len(s) for s in seqs]
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=device)  # [T]
    pos = torch.cat([torch.arange(n, dtype=torch.long) for n in lengths]).to(device)  # [T]
    out = model.forward(ids, pos, ForwardContext.for_prompts(lengths, device=device), output_hidden_states=hidden_states)
    logits = model.compute_logits(out.hidden).float().cpu()  # [T, V]
    per_seq = list(torch.split(logits, lengths))
    layers = None
    if hidden_states and out.layer_hidden is not None:
        layers = [h.float().cpu() for h in out.layer_hidden]  # each [T, hidden]
    return per_seq, layers


@torch.inference_mode()
def reference_forward(ref: nn.Module, seq: list[int], layers: nn.ModuleList | None = None
                      ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The reference on one sequence: logits [L, V] and, with ``layers``, each block's output [L, hidden]."""
    captured: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out))
             for layer in (layers or [])]
    try:
        out = ref(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    per_layer = [h[0].float() for h in captured] if layers is not None else None  # each [L, hidden]
    return out.logits[0].float(), per_layer


def paged_context(start: int, n: int, n_blocks: int, device: torch.device | str) -> ForwardContext:
    """One sequence of ``n`` new tokens after ``start`` cached ones, in blocks ``0 .. n_blocks-1`` of the cache
    (slot ``i`` is token ``i``): a paged prefill, or a decode step when ``n == 1`` after a prefix."""
    return ForwardContext(
        cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device=device),
        seqlens_k=torch.tensor([start + n], dtype=torch.int32, device=device),
        max_seqlen_q=n, max_seqlen_k=start + n,
        slot_mapping=torch.arange(start, start + n, dtype=torch.int64, device=device),
        block_tables=torch.arange(n_blocks, dtype=torch.int32, device=device)[None],
        is_decode=n == 1 and start > 0,
    )


def perplexity(logits: torch.Tensor, seq: list[int]) -> float:
    """exp(mean next-token NLL) of ``seq`` under ``logits`` [L, V]."""
    logprobs = torch.log_softmax(logits[:-1].double(), dim=-1)  # [L-1, V]
    targets = torch.tensor(seq[1:], dtype=torch.long)
    nll = -logprobs.gather(1, targets[:, None]).mean()
    return float(torch.exp(nll))
