"""Endpoint align: the ``align`` stage of a job on an external engine (docs/engines.md), which exposes no
operators or activations, only its OpenAI-compatible endpoint. It replaces operator and layer align with:

* **end to end through the endpoint**: the fixed prompts of ``e2e.PROMPTS`` decoded greedily by the local
  transformers fp32 reference, the engine scoring the same sequences (``echo`` with top-k logprobs: teacher
  forced, as ``e2e.run_e2e`` scores the runtime), the same near-tie rule and perplexity; and a certify job's
  challenge e2e items answered by the engine's own greedy decode (``raw``, in the shape the bundled runtime
  posts), which the portal scores against the reference it holds;
* **the KV-cache self-consistency check** (``kv_self``).

Prompts go as token ids (chat items rendered with the model's own template here: both sides see exactly the
same ids), answers come back as token ids (``support.endpoint_client``). The engine is the one the serve stage
then keeps using (``support.server.running_server``)."""

from __future__ import annotations

import math
from typing import Any

from agents.pipeline.stages.align import kv_self
from agents.pipeline.stages.align.e2e import CHAT, NEW_TOKENS, PERPLEXITY_TEXT, PROMPTS, reference_greedy
from agents.pipeline.support import challenge_answers as answers
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.endpoint_client import EndpointClient
from agents.pipeline.support.errors import JobCancelled, StageFailed
from agents.pipeline.support.lm_backends import ServedError
from agents.pipeline.support.models import (
    align_thresholds,
    decode_token,
    encode,
    eos_token_ids,
    perplexity,
    reference_forward,
    reference_model,
    tokenizer,
)
from agents.pipeline.support.server import running_server
from contract.endpoint_align import METHOD
from contract.thresholds import DEFAULTS

THRESHOLD_KEYS = ("e2e_top_k", "perplexity_rel_tol", "align_min_token_match", "kv_self_max_mean_kl", "kv_self_top_k")

MAX_RECORDED_PER_PROMPT = 10
NOT_APPLICABLE = {
    "ops": "an external engine's operators are not visible; end-to-end align through the endpoint replaces them",
    "layers": "an external engine's activations are not visible; the KV-cache self-consistency check and "
              "end-to-end align replace them",
}


def _best(entries: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    return sorted(entries, key=lambda e: -e["logprob"])[:k]


def _with_text(ctx: StageContext, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "text": decode_token(ctx, e["token"])} for e in entries]


def endpoint_e2e(ctx: StageContext, client: EndpointClient, ref: Any, thresholds: dict[str, float],
                 new_tokens: int = NEW_TOKENS) -> tuple[dict[str, Any], list[str]]:
    """The ``e2e`` block (``e2e.run_e2e``'s keys) with the engine as the target, teacher-forced through echo."""
    k = int(thresholds["e2e_top_k"])
    prompts, notes = encode(ctx, list(PROMPTS), chat=CHAT)
    eos = eos_token_ids(ctx)
    divergences: list[dict[str, Any]] = []
    first: list[int | None] = []
    stopped: list[str] = []
    ref_runs: list[list[int]] = []
    matches = hard = compared = 0
    for p, prompt in enumerate(prompts):
        ctx.check_cancelled()
        ref_tokens, ref_logits = reference_greedy(ref, prompt, new_tokens, eos)
        ref_runs.append(ref_tokens)
        scored = client.prefill(prompt + ref_tokens, k)[len(prompt):]  # position j predicts ref_tokens[j]
        first.append(None)
        stopped.append("eos_reference" if ref_tokens and ref_tokens[-1] in eos else "max_tokens")
        recorded = 0
        for pos, (ref_token, entries) in enumerate(zip(ref_tokens, scored, strict=True)):
            compared += 1
            target_top = _best(entries or [], k)
            target_token = target_top[0]["token"]
            if target_token in eos and ref_token not in eos:
                stopped[p] = "eos_target"
            if target_token == ref_token:
                matches += 1
                continue
            ref_ids = ref_logits[pos].topk(k).indices.tolist()
            near_tie = target_token in ref_ids and ref_token in {e["token"] for e in target_top}
            hard += not near_tie
            if first[p] is None:
                first[p] = pos
            if recorded < MAX_RECORDED_PER_PROMPT:
                recorded += 1
                ref_lp = ref_logits[pos].double().log_softmax(-1)
                ref_top = [{"token": int(t), "text": decode_token(ctx, int(t)), "logprob": round(float(ref_lp[t]), 6)}
                           for t in ref_ids]
                divergences.append({"prompt": p, "position": pos, "ref_token": ref_token, "target_token": target_token,
                                    "ref_top5": ref_top, "target_top5": _with_text(ctx, target_top),
                                    "near_tie": near_tie})
            if stopped[p] == "eos_target":
                break
    if compared - matches > len(divergences):
        notes.append(f"{compared - matches} divergent steps; {len(divergences)} recorded")
    ppl_ids, _ = encode(ctx, [PERPLEXITY_TEXT])
    ppl_ref = perplexity(reference_forward(ref, ppl_ids[0])[0], ppl_ids[0])
    lps = [entries[0]["logprob"] for entries in client.prefill(ppl_ids[0], 1)[1:] if entries]
    ppl_target = math.exp(-sum(lps) / len(lps)) if lps else float("nan")
    ppl_rel = abs(ppl_target - ppl_ref) / ppl_ref
    ppl_ok = ppl_rel <= thresholds["perplexity_rel_tol"]
    tok = tokenizer(ctx)
    block = {
        "method": "reference greedy decode; the engine scores the same prefixes through its endpoint (echo, top-k "
                  "logprobs as token ids)",
        "prompts": len(prompts), "tokens": compared, "new_tokens": new_tokens, "prompt_texts": list(PROMPTS),
        "ref_texts": [tok.decode(t) if tok is not None else " ".join(map(str, t)) for t in ref_runs],
        "ref_tokens": [len(t) for t in ref_runs],
        "token_match_rate": matches / compared if compared else 1.0, "exact": matches == compared,
        "first_divergence": first, "stopped": stopped, "eos_token_ids": sorted(eos), "divergences": divergences,
        "hard_divergences": hard, "perplexity_ref": ppl_ref, "perplexity_target": ppl_target,
        "perplexity_rel_diff": ppl_rel, "perplexity_passed": ppl_ok, "passed": hard == 0 and ppl_ok,
    }
    return block, notes


def challenge_raw(ctx: StageContext, client: EndpointClient, device: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The e2e ``raw`` block of a job whose challenge has e2e items, answered by the engine's greedy decode
    through its endpoint (``e2e.challenge_raw``'s shape); None without such a challenge."""
    challenge = ctx.challenge
    if not isinstance(challenge, dict) or not challenge.get("e2e"):
        return None, []
    nonce = answers.nonce_of(challenge, "challenge", ctx.nonce)
    block: dict[str, Any] = {"nonce": nonce, "method": "engine greedy decode through its endpoint (/v1/completions, "
                                                       "prompt token ids, top-k logprobs as token ids)",
                             "device": device, "dtype": ctx.dtype}
    try:
        top_k = answers.top_k_of(challenge, "challenge")
        items = answers.parse_items(challenge, "challenge", ("e2e",))["e2e"]
        prompts, limits = answers.e2e_prompts(ctx, items)
        block["top_k"] = top_k
        runs = []
        for n, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):
            ctx.check_cancelled()
            run = client.greedy(prompt, limit, top_k)
            runs.append({key: run[key] for key in ("tokens", "top_logprobs", "prompt_tokens")})
            ctx.progress(n + 1, len(prompts), "align challenge e2e")
    except JobCancelled:
        raise
    except Exception as exc:  # noqa: BLE001 - the rest of align still stands; the portal sees no answers
        return {**block, "items": [], "error": f"{type(exc).__name__}: {exc}"}, [
            f"the challenge's e2e items were not answered: {type(exc).__name__}: {exc}"]
    block["items"] = [{"id": item["id"], **run} for item, run in zip(items, runs, strict=True)]
    return block, [f"challenge: {len(items)} e2e items answered by the engine for the portal to score"]


def run(ctx: StageContext) -> dict[str, Any]:
    """The endpoint align section (docs/stage-report.md): method "endpoint", engine, endpoint, served_model,
    e2e (with ``raw`` under a challenge), kv_self, checks, not_applicable, passed."""
    thresholds = {**{k: DEFAULTS[k] for k in THRESHOLD_KEYS}, **align_thresholds(ctx)}
    server = running_server(ctx)  # the job's engine, started and ready; the serve stage keeps it
    model = server.served_model() if hasattr(server, "served_model") else None
    client = EndpointClient(server.url, model)
    engine = (ctx.engine or {}).get("name")
    section: dict[str, Any] = {"method": METHOD, "engine": engine, "endpoint": server.url, "served_model": model,
                               "passed": False, "thresholds": thresholds, "reference": "transformers fp32 cpu",
                               "not_applicable": dict(NOT_APPLICABLE)}
    notes: list[str] = []
    try:
        ctx.progress(0, 3, "endpoint align")
        ctx.emit("log", "align: loading the transformers fp32 CPU reference (end to end through the endpoint)")
        ref = reference_model(ctx)
        section["e2e"], e2e_notes = endpoint_e2e(ctx, client, ref, thresholds)
        notes += e2e_notes
        raw, raw_notes = challenge_raw(ctx, client, "engine")
        if raw is not None:
            section["e2e"]["raw"] = raw
        notes += raw_notes
        ctx.progress(1, 3, "endpoint align")
        try:
            section["kv_self"] = kv_self.run(ctx, client, thresholds)
        except ServedError as exc:
            section.setdefault("part_errors", {})["kv_self"] = str(exc)
            notes.append(f"kv_self check failed to run: {exc}")
        ctx.progress(3, 3, "endpoint align")
    except ServedError as exc:
        raise StageFailed(f"endpoint align: engine {engine}: {exc}") from exc
    finally:
        client.close()
    kv_ok = bool((section.get("kv_self") or {}).get("passed"))
    missing = [key for key in ("e2e", "kv_self") if not section.get(key)]
    if missing:
        section["missing"] = missing
    section["complete"] = not missing
    section["checks"] = {"e2e": section["e2e"]["passed"], "kv_self": kv_ok if "kv_self" in section else None}
    section["passed"] = bool(section["e2e"]["passed"] and kv_ok and not missing and not section.get("part_errors"))
    section["notes"] = notes
    return section
