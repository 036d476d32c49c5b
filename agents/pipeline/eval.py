"""The ``eval`` stage (tier 6, "validated"): task quality of the target within tolerance of the reference
(``transformers`` fp32 CPU, same weights) on a small fixed built-in set.

* multiple choice by log-likelihood: each choice's mean token log-probability after the question; the
  highest is the answer; accuracy on both sides, and how often the two sides pick the same choice;
* perplexity of fixed texts on both sides.

Passes when |accuracy_target − accuracy_ref| ≤ ``eval_accuracy_tol`` (default 0.07: at most one of 16
answers may flip) and every text's |ppl_target − ppl_ref| / ppl_ref ≤ ``eval_perplexity_rel_tol`` (default
0.02). Both overridable through the job's thresholds. Not a default stage."""

from __future__ import annotations

from typing import Any

import torch

from agents.pipeline.align_common import perplexity, reference_model, target_forward, target_model, tokenizer
from agents.pipeline.base import StageContext, StageFailed
from agents.pipeline.eval_data import MULTIPLE_CHOICE, PERPLEXITY_TEXTS
from agents.pipeline.thresholds import EVAL as EVAL_THRESHOLDS

DEFAULT_TOLERANCES: dict[str, float] = EVAL_THRESHOLDS


def _mc_sequences(tok: Any) -> tuple[list[list[int]], list[int]]:
    """Every (question + choice) sequence, and the number of prompt tokens of each."""
    seqs, prompt_lens = [], []
    for question, choices, _ in MULTIPLE_CHOICE:
        prompt = list(tok(question)["input_ids"])
        for choice in choices:
            seqs.append(prompt + list(tok(" " + choice, add_special_tokens=False)["input_ids"]))
            prompt_lens.append(len(prompt))
    return seqs, prompt_lens


@torch.inference_mode()
def _reference_logits(ref: torch.nn.Module, seqs: list[list[int]]) -> list[torch.Tensor]:
    """One right-padded batch on the reference (causal: real tokens never see the padding)."""
    longest = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), longest, dtype=torch.long)  # [B, L]
    mask = torch.zeros(len(seqs), longest, dtype=torch.long)  # [B, L]
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    logits = ref(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()  # [B, L, V]
    return [logits[i, : len(s)] for i, s in enumerate(seqs)]


def _choice_scores(logits: list[torch.Tensor], seqs: list[list[int]], prompt_lens: list[int]) -> torch.Tensor:
    """Mean log-probability of each sequence's continuation tokens. Returns [num_sequences]."""
    scores = []
    for lg, seq, n in zip(logits, seqs, prompt_lens, strict=True):
        logprobs = torch.log_softmax(lg[n - 1 : len(seq) - 1].double(), dim=-1)  # [C, V]
        targets = torch.tensor(seq[n:], dtype=torch.long)  # [C]
        scores.append(logprobs.gather(1, targets[:, None]).mean())
    return torch.stack(scores)


def run(ctx: StageContext) -> dict[str, Any]:
    """The eval section: passed, tolerances, tasks, perplexities."""
    tol = {**DEFAULT_TOLERANCES, **{k: float(v) for k, v in ctx.thresholds.items() if k in DEFAULT_TOLERANCES}}
    tok = tokenizer(ctx)
    if tok is None:
        raise StageFailed("eval needs the model's tokenizer (tokenizer.json), and the checkpoint has none")
    target, ref = target_model(ctx), reference_model(ctx)
    seqs, prompt_lens = _mc_sequences(tok)
    ctx.progress(0, 2, "eval tasks")
    n_choices = [len(choices) for _, choices, _ in MULTIPLE_CHOICE]
    t_scores = _choice_scores(target_forward(ctx, target, seqs)[0], seqs, prompt_lens)
    ctx.check_cancelled()
    r_scores = _choice_scores(_reference_logits(ref, seqs), seqs, prompt_lens)
    t_pick, r_pick, answers = [], [], []
    start = 0
    for (_, _, answer), n in zip(MULTIPLE_CHOICE, n_choices, strict=True):
        t_pick.append(int(t_scores[start : start + n].argmax()))
        r_pick.append(int(r_scores[start : start + n].argmax()))
        answers.append(answer)
        start += n
    items = len(answers)
    acc_t = sum(p == a for p, a in zip(t_pick, answers, strict=True)) / items
    acc_r = sum(p == a for p, a in zip(r_pick, answers, strict=True)) / items
    agreement = sum(a == b for a, b in zip(t_pick, r_pick, strict=True)) / items
    ctx.progress(1, 2, "eval tasks")

    texts = []
    for text in PERPLEXITY_TEXTS:
        ids = list(tok(text)["input_ids"])
        ppl_r = perplexity(_reference_logits(ref, [ids])[0], ids)
        ppl_t = perplexity(target_forward(ctx, target, [ids])[0][0], ids)
        texts.append({"chars": len(text), "tokens": len(ids), "perplexity_ref": ppl_r, "perplexity_target": ppl_t,
                      "rel_diff": abs(ppl_t - ppl_r) / ppl_r})
    ctx.progress(2, 2, "eval tasks")
    acc_ok = abs(acc_t - acc_r) <= tol["eval_accuracy_tol"]
    worst_ppl = max(t["rel_diff"] for t in texts)
    ppl_ok = worst_ppl <= tol["eval_perplexity_rel_tol"]
    summary = (f"multiple choice: accuracy {acc_t:.3f} vs reference {acc_r:.3f} (agreement {agreement:.3f}); "
               f"perplexity worst relative difference {worst_ppl:.4f}")
    return {
        "passed": acc_ok and ppl_ok,
        "tolerances": tol,
        "tasks": [{"name": "multiple_choice_loglik", "items": items, "accuracy_ref": acc_r, "accuracy_target": acc_t,
                   "agreement": agreement, "score_max_abs_diff": float((t_scores - r_scores).abs().max()),
                   "passed": acc_ok}],
        "perplexity": texts,
        "perplexity_ref": sum(t["perplexity_ref"] for t in texts) / len(texts),
        "perplexity_target": sum(t["perplexity_target"] for t in texts) / len(texts),
        "summary": summary if acc_ok and ppl_ok else f"outside tolerance: {summary}",
    }
