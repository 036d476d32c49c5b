"""Align's compiled-path check (a job's ``bench.compile``): the runtime engine decodes the align prompts greedily
on the target model eager, then with the compiled path installed on the same weights (``engine/compiled.py``),
and the two token lists must be equal — past a first divergence, only a near-tie (each side's token within the
other's top-k, the align rule of ``contract.verdicts``) is tolerated. The block also carries what compiling cost in this process:
compile seconds, graphs, graph breaks, recompiles after the warm-up and the compilation caches' hits/misses
(this check runs before the serve stage: a first run fills the cache the compiled server then reads)."""

from __future__ import annotations

from typing import Any

from agents.pipeline.stages.align.e2e import CHAT, NEW_TOKENS, PROMPTS
from agents.pipeline.support.compiled import skipped
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.models import align_thresholds, encode, target_model


def greedy(engine: Any, prompts: list[list[int]], new_tokens: int, top: int) -> list[list[tuple[int, set[int]]]]:
    """Per prompt, each generated token with the ids of its step's ``top`` most likely tokens."""
    from agents.runtime.engine import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, logprobs=top)
    ids = [engine.add_request(p, params) for p in prompts]
    steps: dict[str, list[tuple[int, set[int]]]] = {i: [] for i in ids}
    done: set[str] = set()
    while len(done) < len(ids):
        for out in engine.step():
            if out.error:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            for token, lp in zip(out.new_token_ids, out.new_logprobs or [], strict=False):
                steps[out.request_id].append((token, {t for t, _ in lp.top}))
            if out.finished:
                done.add(out.request_id)
    return [steps[i] for i in ids]


def compare(eager: list[list[tuple[int, set[int]]]], compiled: list[list[tuple[int, set[int]]]]
            ) -> dict[str, Any]:
    """Token equality per prompt; the first divergence of each, and whether it is a near-tie. ``rows`` keep
    both token lists and, at a first divergence, both sides' top-k ids: the portal's verdict recomputes from them
    (``contract.verdicts.align._compiled``)."""
    first: list[int | None] = []
    divergences: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    matches = total = 0
    for p, (a, b) in enumerate(zip(eager, compiled, strict=True)):
        first.append(None)
        row: dict[str, Any] = {"prompt": p, "eager": [t for t, _ in a], "compiled": [t for t, _ in b],
                               "eager_top": None, "compiled_top": None}
        rows.append(row)
        for pos, ((ta, top_a), (tb, top_b)) in enumerate(zip(a, b, strict=False)):
            total += 1
            if ta == tb:
                matches += 1
                continue
            first[p] = pos
            row["eager_top"], row["compiled_top"] = sorted(top_a), sorted(top_b)
            divergences.append({"prompt": p, "position": pos, "eager_token": ta, "compiled_token": tb,
                                "near_tie": tb in top_a and ta in top_b})
            break  # past a divergence the two decodes continue from different prefixes
        if len(a) != len(b) and first[p] is None:
            divergences.append({"prompt": p, "position": min(len(a), len(b)), "eager_tokens": len(a),
                                "compiled_tokens": len(b), "near_tie": False})
    return {"tokens": total, "token_match_rate": matches / total if total else 1.0,
            "equal": not divergences, "first_divergence": first, "divergences": divergences, "rows": rows,
            "passed": all(d["near_tie"] for d in divergences)}


def run(ctx: StageContext) -> dict[str, Any]:
    """The align section's ``compile`` block (the job asked for the compiled path), or one saying why not."""
    not_run = skipped(ctx)
    if not_run is not None:
        return {**not_run, "passed": True}
    from agents.runtime.engine import LLMEngine
    from agents.runtime.engine.compiled import CompileUnavailable
    from agents.runtime.engine.tokenizer import Tokenizer

    model = target_model(ctx)
    prompts, notes = encode(ctx, list(PROMPTS), chat=CHAT)
    top = int(align_thresholds(ctx)["e2e_top_k"])
    tokenizer = Tokenizer(ctx.model_dir)
    blocks = sum(-(-(len(p) + NEW_TOKENS) // 16) for p in prompts) + 4  # the prompts at once, and a margin
    settings = {"num_blocks": blocks, "device": ctx.device, "dtype": ctx.dtype, "max_num_batched_tokens": 64}
    eager_engine = LLMEngine(None, model=model, config=ctx.config, tokenizer=tokenizer, **settings)
    eager = greedy(eager_engine, prompts, NEW_TOKENS, top)
    try:
        engine = LLMEngine(None, model=model, config=ctx.config, tokenizer=tokenizer, compile=True, **settings)
    except CompileUnavailable as exc:
        return {"requested": True, "enabled": False, "reason": str(exc), "passed": True}
    try:
        engine.warmup()
        compiled = greedy(engine, prompts, NEW_TOKENS, top)
        stats = engine.compiled.stats.report()
    finally:
        engine.compiled.remove()  # the model is eager again for the stages after align
    block = compare(eager, compiled)
    keep = ("compile_seconds", "graphs", "graph_breaks", "graph_break_reasons", "recompiles_after_warmup",
            "recompile_reasons", "cache", "cache_dir", "compiler")
    return {"requested": True, "enabled": True, "method": "runtime greedy decode, eager then compiled, same weights",
            "prompts": len(prompts), "new_tokens": NEW_TOKENS, "top_k": top, **block,
            **{k: stats[k] for k in keep}, "notes": notes}
