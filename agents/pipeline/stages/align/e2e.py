"""End-to-end alignment. The reference decodes greedily from each fixed prompt; the target then scores the
same sequences in one no-cache forward, so at every step both sides see the same prefix. Up to the first
divergence this is exactly the target's own greedy decode; past it, the comparison stays meaningful:
a step where the tokens differ is a near-tie when each side's token is within the other's top-k. The e2e
check passes when every step matches or is a near-tie, and the perplexity of a fixed text agrees.

A continuation ends at the end-of-sequence token on either side: the reference stops after emitting one (the
EOS step itself is compared), and the comparison of a prompt stops at the first step where the target predicts
EOS — past it the target would have stopped, and what the reference generates there is not compared with
anything the target would say. Each prompt records why it stopped (``stopped``).

A certify job's challenge (docs/references.md) adds the ``raw`` block: the portal's drawn e2e items answered by
the target alone, its own greedy decode with the top-k logprobs of every position, for the portal to score against
the reference it holds (``challenge_raw``). The align stage runs before any server is up, so the target is the
runtime in-process: the model the load stage left, through the runtime's own engine (``LLMEngine``: the paged KV
cache, chunked prefill and greedy sampler the server runs), in the job's dtype on the job's device."""

from __future__ import annotations

from typing import Any

import torch

from agents.pipeline.support import challenge_answers as answers
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import JobCancelled
from agents.pipeline.support.lm_backends import top_entries
from agents.pipeline.support.models import (
    decode_token,
    encode,
    eos_token_ids,
    perplexity,
    reference_forward,
    target_forward,
    tokenizer,
)

PROMPTS: tuple[str, ...] = (
    "The harbour woke before the sun, and",
    "Question: Which planet is closest to the sun?\nAnswer:",
    "Write one sentence about rivers.",  # rendered with the chat template when the tokenizer has one
)
CHAT: tuple[bool, ...] = (False, False, True)
NEW_TOKENS = 16
MAX_RECORDED_PER_PROMPT = 10  # the first divergence of every prompt is always among them
PERPLEXITY_TEXT = (
    "Every morning the baker weighed the flour, the salt, the water and the yeast. She mixed them slowly, "
    "let the dough rest, folded it, and rested it again."
)


def _top(ctx: StageContext, logits: torch.Tensor, k: int) -> list[dict[str, Any]]:
    logprobs = torch.log_softmax(logits.double(), dim=-1)  # [V]
    values, ids = logprobs.topk(k)
    return [{"token": int(t), "text": decode_token(ctx, int(t)), "logprob": round(float(v), 6)}
            for v, t in zip(values, ids, strict=True)]


def compare_step(ref_logits: torch.Tensor, target_logits: torch.Tensor, ref_token: int, k: int) -> tuple[int, bool]:
    """The target's greedy token at one step and whether a mismatch is a near-tie (each side's token within
    the other's top-k). Both logits [V]."""
    target_token = int(target_logits.argmax())
    if target_token == ref_token:
        return target_token, False
    ref_top = set(ref_logits.topk(k).indices.tolist())
    target_top = set(target_logits.topk(k).indices.tolist())
    return target_token, target_token in ref_top and ref_token in target_top


def reference_greedy(ref: torch.nn.Module, prompt: list[int], steps: int, eos: set[int] | frozenset[int] = frozenset(),
                     ) -> tuple[list[int], list[torch.Tensor]]:
    """The reference's greedy continuation (no cache, whole sequence each step) and each step's logits [V],
    ending after an end-of-sequence token."""
    seq = list(prompt)
    step_logits: list[torch.Tensor] = []
    for _ in range(steps):
        logits, _ = reference_forward(ref, seq)
        step_logits.append(logits[-1])  # [V]
        seq.append(int(logits[-1].argmax()))
        if seq[-1] in eos:
            break
    return seq[len(prompt):], step_logits


def run_e2e(ctx: StageContext, target: Any, ref: torch.nn.Module, thresholds: dict[str, float],
            new_tokens: int = NEW_TOKENS) -> tuple[dict[str, Any], list[str]]:
    """The ``e2e`` block of the align section, and notes."""
    k = int(thresholds["e2e_top_k"])
    prompts, notes = encode(ctx, list(PROMPTS), chat=CHAT)
    eos = eos_token_ids(ctx)
    ref_runs = []
    for prompt in prompts:
        ctx.check_cancelled()
        ref_runs.append(reference_greedy(ref, prompt, new_tokens, eos))
    # target: the prompt plus the reference's tokens (the last one needs no prediction)
    scored = [prompt + tokens[:-1] for prompt, (tokens, _) in zip(prompts, ref_runs, strict=True)]
    target_logits, _ = target_forward(ctx, target, scored)

    divergences: list[dict[str, Any]] = []
    first: list[int | None] = []
    stopped: list[str] = []
    matches = hard = compared = 0
    logits_err = 0.0
    for p, (prompt, (ref_tokens, ref_logits)) in enumerate(zip(prompts, ref_runs, strict=True)):
        tgt = target_logits[p][len(prompt) - 1:]  # [new_tokens, V]: predictions of each generated position
        first.append(None)
        stopped.append("eos_reference" if ref_tokens and ref_tokens[-1] in eos else "max_tokens")
        recorded = 0
        for pos, ref_token in enumerate(ref_tokens):
            compared += 1
            logits_err = max(logits_err, float((tgt[pos] - ref_logits[pos]).abs().max()))
            target_token, near_tie = compare_step(ref_logits[pos], tgt[pos], ref_token, k)
            if target_token in eos and ref_token not in eos:
                stopped[p] = "eos_target"  # the target ends here: nothing after this step is compared
            if target_token == ref_token:
                matches += 1
                continue
            if first[p] is None:
                first[p] = pos
            ref_top, tgt_top = _top(ctx, ref_logits[pos], k), _top(ctx, tgt[pos], k)
            hard += not near_tie
            if recorded < MAX_RECORDED_PER_PROMPT:
                recorded += 1
                divergences.append({"prompt": p, "position": pos, "ref_token": ref_token,
                                    "target_token": target_token, "ref_top5": ref_top, "target_top5": tgt_top,
                                    "near_tie": near_tie})
            if stopped[p] == "eos_target":
                break
    total = compared
    if total - matches > len(divergences):
        notes.append(f"{total - matches} divergent steps; {len(divergences)} recorded (the first "
                     f"{MAX_RECORDED_PER_PROMPT} of each prompt)")

    ppl_ids, _ = encode(ctx, [PERPLEXITY_TEXT])
    ppl_ref = perplexity(reference_forward(ref, ppl_ids[0])[0], ppl_ids[0])
    ppl_target = perplexity(target_forward(ctx, target, ppl_ids)[0][0], ppl_ids[0])
    ppl_rel = abs(ppl_target - ppl_ref) / ppl_ref
    ppl_ok = ppl_rel <= thresholds["perplexity_rel_tol"]
    block = {
        "method": "reference greedy decode; target scored on the same prefixes (teacher-forced)",
        "prompts": len(prompts),
        "tokens": total,
        "new_tokens": new_tokens,
        "prompt_texts": list(PROMPTS),
        "ref_texts": [_text(ctx, tokens) for tokens, _ in ref_runs],
        "ref_tokens": [len(tokens) for tokens, _ in ref_runs],
        "token_match_rate": matches / total if total else 1.0,
        "exact": matches == total,
        "first_divergence": first,
        "stopped": stopped,
        "eos_token_ids": sorted(eos),
        "divergences": divergences,
        "hard_divergences": hard,
        "logits_max_abs_err": logits_err,
        "perplexity_ref": ppl_ref,
        "perplexity_target": ppl_target,
        "perplexity_rel_diff": ppl_rel,
        "perplexity_passed": ppl_ok,
        "passed": hard == 0 and ppl_ok,
    }
    return block, notes


def _text(ctx: StageContext, tokens: list[int]) -> str:
    tok = tokenizer(ctx)
    return tok.decode(tokens) if tok is not None else " ".join(map(str, tokens))


def target_greedy_top(ctx: StageContext, model: Any, prompts: list[list[int]], limits: list[int], top_k: int
                      ) -> list[dict[str, Any]]:
    """Per prompt the target's greedy continuation through the runtime's engine (ending at the model's
    end-of-sequence tokens or ``limits[i]`` tokens) with each position's logprobs: ``{"tokens", "top_logprobs",
    "prompt_tokens"}`` in the reference stage's shape (``support.lm_backends.top_entries``)."""
    from agents.runtime.engine import LLMEngine, SamplingParams
    from agents.runtime.engine.tokenizer import Tokenizer

    block = 16
    blocks = sum(-(-(len(p) + n) // block) for p, n in zip(prompts, limits, strict=True)) + 4  # all at once
    engine = LLMEngine(None, model=model, config=ctx.config, tokenizer=Tokenizer(ctx.model_dir), num_blocks=blocks,
                       block_size=block, device=ctx.device, dtype=ctx.dtype, max_num_batched_tokens=512)
    try:
        ids = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0.0, logprobs=top_k))
               for p, n in zip(prompts, limits, strict=True)]
        runs: dict[str, dict[str, Any]] = {i: {"tokens": [], "top_logprobs": []} for i in ids}
        finished = 0
        while finished < len(ids):
            ctx.check_cancelled()
            for out in engine.step():
                if out.error:
                    raise RuntimeError(f"the runtime failed an e2e request: {out.error}")
                run = runs[out.request_id]
                for token, lp in zip(out.new_token_ids, out.new_logprobs or [], strict=True):
                    run["tokens"].append(int(token))
                    run["top_logprobs"].append(top_entries(token, lp.logprob, lp.top))
                if out.finished:
                    finished += 1
                    ctx.progress(finished, len(ids), "align challenge e2e")
    finally:
        engine.close()
    return [{**runs[i], "prompt_tokens": len(p)} for i, p in zip(ids, prompts, strict=True)]


def challenge_raw(ctx: StageContext, target: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """The e2e ``raw`` block of a job whose challenge has e2e items: ``{"nonce", "method", "top_k", "items":
    [{"id", "tokens", "top_logprobs", "prompt_tokens"}]}``; None without such a challenge. A challenge the
    target cannot answer leaves ``items`` empty and says why in ``error`` (the portal then calls it
    incomplete)."""
    challenge = ctx.challenge
    if not isinstance(challenge, dict) or not challenge.get("e2e"):
        return None, []
    nonce = answers.nonce_of(challenge, "challenge", ctx.nonce)
    block: dict[str, Any] = {"nonce": nonce, "method": "runtime engine greedy decode (in-process, paged KV cache)",
                             "device": ctx.device, "dtype": ctx.dtype}
    try:
        top_k = answers.top_k_of(challenge, "challenge")
        items = answers.parse_items(challenge, "challenge", ("e2e",))["e2e"]
        prompts, limits = answers.e2e_prompts(ctx, items)
        block["top_k"] = top_k
        runs = target_greedy_top(ctx, target, prompts, limits, top_k)
    except JobCancelled:
        raise
    except Exception as exc:  # noqa: BLE001 - the rest of align still stands; the portal sees no answers
        return {**block, "items": [], "error": f"{type(exc).__name__}: {exc}"}, [
            f"the challenge's e2e items were not answered: {type(exc).__name__}: {exc}"]
    block["items"] = [{"id": item["id"], **run} for item, run in zip(items, runs, strict=True)]
    return block, [f"challenge: {len(items)} e2e items answered by the target for the portal to score"]
