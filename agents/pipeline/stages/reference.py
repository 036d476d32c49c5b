"""The ``reference`` stage of a reference run (a job with ``purpose: "reference"`` on staff-operated hardware,
docs/references.md): every item of the job's ``reference_pool`` answered by ``transformers`` in fp32 on CPU
(``support.models.reference_model``), the outputs the portal keeps and scores the targets' raw outputs against.

* ``e2e``: the greedy continuation (argmax of the fp32 logits with the KV cache, ending after an end-of-sequence
  token or ``max_tokens``) and, at every position, the chosen token's logprob then the other ``top_k`` best;
* ``mc``: each choice's log-likelihood after the context and whether it is the greedy continuation;
* ``qa``: the greedy text up to ``until`` / ``max_tokens``;
* ``ppl``: the document's rolling log-likelihood and its token count;
* ``needle``: the greedy answer to the prompt built from the item's key, value and distractors;
* ``code``: the greedy HumanEval completion, its sha256 and its program's result in the sandbox;
* ``agent``: the actions of the agent_kv episode of the item's seed, played greedily turn by turn.

The section echoes the pool's version and the job's nonce; it gates no tier (the portal decides what it is)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from agents.pipeline.support import challenge_acting as acting
from agents.pipeline.support import challenge_answers as answers
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.endpoints import chat_template_text
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.lm_backends import ReferenceLM
from agents.pipeline.support.models import eos_token_ids, reference_model, tokenizer
from contract.conformance import declares_tools

WHERE = "reference_pool"


def _version(pool: Mapping[str, Any]) -> str:
    version = pool.get("version", pool.get("pool_version"))
    if not isinstance(version, str) or not version or len(version) > 128:
        raise StageFailed(f"{WHERE}.version: must be the pool's version (a string of at most 128 characters), "
                          f"got {version!r}")
    return version


def run(ctx: StageContext) -> dict[str, Any]:
    """The reference section: pool_version, nonce, top_k, e2e, mc, qa, ppl, needle (docs/references.md)."""
    pool = ctx.reference_pool
    if not isinstance(pool, Mapping):
        raise StageFailed("the reference stage answers the job's reference_pool, and this job carries none")
    version = _version(pool)
    top_k = answers.top_k_of(pool, WHERE)
    items = answers.parse_items(pool, WHERE)
    total = sum(len(v) for v in items.values())
    if not total:
        raise StageFailed(f"{WHERE}: no items of any kind ({', '.join(answers.KINDS)})")
    tok = tokenizer(ctx)
    if tok is None:
        raise StageFailed("the reference stage needs the model's tokenizer, and the checkpoint has none")
    ctx.state.drop_models()  # the last stage: the runtime's copy of the weights is not needed now
    ctx.emit("log", f"reference: {total} pool items ({', '.join(f'{len(v)} {k}' for k, v in items.items() if v)}) "
                    "through transformers float32 cpu")
    lm = ReferenceLM(reference_model(ctx), tok)
    section: dict[str, Any] = {"pool_version": version, "nonce": ctx.nonce, "top_k": top_k,
                               "reference": "transformers float32 cpu",
                               # the portal's fact: tier 3 of every cell of a release whose template declares
                               # tools needs a passing conformance (contract.tiers)
                               "template_declares_tools": declares_tools(chat_template_text(ctx.model_dir))}
    seconds: dict[str, float] = {}
    if items["e2e"]:
        t0 = time.perf_counter()
        prompts, limits = answers.e2e_prompts(ctx, items["e2e"])
        runs = lm.greedy_top(prompts, limits, top_k, eos_token_ids(ctx),
                             lambda done, n: ctx.progress(done, n, "reference e2e"), ctx.check_cancelled)
        section["e2e"] = [{"id": item["id"], **run} for item, run in zip(items["e2e"], runs, strict=True)]
        seconds["e2e"] = round(time.perf_counter() - t0, 3)
    raw, eval_seconds = answers.answer_eval(lm, tok, items, ctx, "reference", context=answers.context_length(ctx),
                                            window=answers.ppl_window(ctx))
    section.update(raw)
    for kind, answer in (("code", acting.answer_code), ("agent", acting.answer_agent)):
        if items[kind]:
            t0 = time.perf_counter()
            ctx.emit("log", f"reference: {len(items[kind])} {kind} items")
            extra = {"where": WHERE} if kind == "code" else {}
            section[kind] = answer(lm, tok, items[kind], ctx, "reference", context=answers.context_length(ctx),
                                   **extra)
            seconds[kind] = round(time.perf_counter() - t0, 3)
    for kind in answers.KINDS:
        section.setdefault(kind, [])
    section["counts"] = {kind: len(section[kind]) for kind in answers.KINDS}
    section["ppl_window"] = answers.ppl_window(ctx)
    section["seconds"] = {**seconds, **eval_seconds}
    section["notes"] = [f"needle {row['id']}: {row['error']}" for row in section["needle"] if row.get("error")]
    return section
