"""The quantisation's own cost, end to end: the align section's ``e2e_original`` block (docs/quantized.md).

When the job's release is quantised and its unquantised original is on this host, the original (``transformers``
fp32 on CPU, its own weights) decodes greedily from the e2e prompts and the target (the quantised release in the
runtime, the model the other checks use) scores the same prefixes teacher-forced, exactly as ``e2e`` does against
the dequantised reference. Reported: the greedy token match, the mean and largest KL(original ‖ target) over the
full vocabulary and over the original's top-k (plus one bucket for the rest), and the perplexity of the fixed text
on both. Informational: it never fails align (the quantisation is what it measures, not the runtime's kernels);
the thresholds of the quantisation's cost are the quality-cost row's (the eval delta against the original).

Where the original is: ``ctx.original_dir`` (``day0 adapt --original DIR``), else ``DIR/original`` beside the
release as ``day0 make-model --quant`` writes it. No original, no block (and no note)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from agents.pipeline.stages.align.e2e import CHAT, NEW_TOKENS, PERPLEXITY_TEXT, PROMPTS, reference_greedy
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.models import (
    check_reference_fits,
    encode,
    eos_token_ids,
    perplexity,
    reference_forward,
    target_forward,
)
from contract.quant_cost import METHOD

TOP_K = 10


def original_dir(ctx: StageContext) -> Path | None:
    """The unquantised original's directory for this job, or None: the one the job names, else ``original/``
    beside a quantised release."""
    named = getattr(ctx, "original_dir", None)
    if named is not None:
        return Path(named)
    if ctx.model_dir is None or not (ctx.config or {}).get("quantization_config"):
        return None
    local = ctx.model_dir / "original"
    return local if (local / "config.json").is_file() else None


def _load_original(path: Path, config: dict[str, Any]) -> torch.nn.Module:
    """transformers fp32 on CPU from the original's own checkpoint; it must be unquantised and share the
    release's vocabulary (a ValueError says which)."""
    from transformers import AutoModelForCausalLM

    original_config = json.loads((path / "config.json").read_text())
    if original_config.get("quantization_config"):
        raise ValueError(f"{path} is itself quantised ({original_config['quantization_config'].get('quant_method')})")
    if original_config.get("vocab_size") != config.get("vocab_size"):
        raise ValueError(f"{path} has vocab_size {original_config.get('vocab_size')}, the release "
                         f"{config.get('vocab_size')}: not the same tokenizer")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def kl_step(p_logits: torch.Tensor, q_logits: torch.Tensor, k: int) -> tuple[float, float]:
    """KL(p ‖ q) of one step over the full vocabulary, and over p's top-k tokens plus one bucket holding the
    rest of each side's mass. Both logits [V]; nats."""
    logp, logq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    full = float((logp.exp() * (logp - logq)).sum())
    ids = logp.topk(min(k, logp.shape[0])).indices
    p_top, q_top = logp[ids].exp(), logq[ids].exp()
    p_rest, q_rest = (1 - p_top.sum()).clamp_min(0), (1 - q_top.sum()).clamp_min(1e-300)
    top = float((p_top * (p_top.log() - q_top.log())).sum())
    if p_rest > 0:
        top += float(p_rest * (p_rest.log() - q_rest.log()))
    return max(full, 0.0), max(top, 0.0)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def compare(ctx: StageContext, target: Any, original: torch.nn.Module, new_tokens: int = NEW_TOKENS,
            top_k: int = TOP_K) -> dict[str, Any]:
    """The comparison's numbers: the original's greedy decode, the target teacher-forced on it."""
    prompts, _ = encode(ctx, list(PROMPTS), chat=CHAT)
    eos = eos_token_ids(ctx)
    runs = []
    for prompt in prompts:
        ctx.check_cancelled()
        runs.append(reference_greedy(original, prompt, new_tokens, eos))
    scored = [prompt + tokens[:-1] for prompt, (tokens, _) in zip(prompts, runs, strict=True)]
    target_logits, _ = target_forward(ctx, target, scored)
    matches = compared = 0
    first: list[int | None] = []
    kls: list[float] = []
    top_kls: list[float] = []
    for p, (prompt, (tokens, logits)) in enumerate(zip(prompts, runs, strict=True)):
        tgt = target_logits[p][len(prompt) - 1:]  # [new_tokens, V]
        first.append(None)
        for pos, token in enumerate(tokens):
            compared += 1
            if int(tgt[pos].argmax()) == token:
                matches += 1
            elif first[p] is None:
                first[p] = pos
            full, top = kl_step(logits[pos], tgt[pos], top_k)
            kls.append(full)
            top_kls.append(top)
    ppl_ids, _ = encode(ctx, [PERPLEXITY_TEXT])
    ppl_original = perplexity(reference_forward(original, ppl_ids[0])[0], ppl_ids[0])
    ppl_target = perplexity(target_forward(ctx, target, ppl_ids)[0][0], ppl_ids[0])
    return {
        "prompts": len(prompts), "tokens": compared, "top_k": top_k,
        "token_match_rate": matches / compared if compared else 1.0, "exact": matches == compared,
        "first_divergence": first,
        "kl_mean": _mean(kls), "kl_max": max(kls, default=0.0),
        "topk_kl_mean": _mean(top_kls), "topk_kl_max": max(top_kls, default=0.0),
        "perplexity_original": ppl_original, "perplexity_target": ppl_target,
        "perplexity_rel_diff": (ppl_target - ppl_original) / ppl_original if math.isfinite(ppl_original) else None,
    }


def run(ctx: StageContext, target: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """The ``e2e_original`` block and notes; (None, []) when this job has no original. A failure to load or
    compare leaves a block with ``error`` (align's verdict is untouched either way)."""
    path = original_dir(ctx)
    if path is None:
        return None, []
    block: dict[str, Any] = {"method": METHOD, "original": path.name if path.parent == ctx.model_dir else str(path),
                             "informational": True}
    try:
        ctx.emit("log", f"align: the quantised target against its original {path}")
        check_reference_fits(ctx)  # a second fp32 model beside the reference: this host must still hold it
        original = _load_original(path, ctx.config)
        block.update(compare(ctx, target, original))
    except (OSError, ValueError, KeyError, RuntimeError, StageFailed) as exc:
        block["error"] = f"{type(exc).__name__}: {exc}"
        return block, [f"the quantisation's cost against the original was not measured: {block['error']}"]
    return block, [f"quantisation cost against the original: token match {block['token_match_rate']:.3f}, "
                   f"mean KL {block['kl_mean']:.3g} nats (informational: it does not fail align)"]
