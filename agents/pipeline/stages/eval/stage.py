"""The ``eval`` stage (tier 6, "validated"): task quality of the SERVED target against the ``transformers`` fp32
reference on the same weights, the same token ids on both sides.

Suites (``contract/suites``, lm-eval task files, see ``contract.suites.tasks``): ``day0_mc`` (multiple choice by
log-likelihood), ``day0_qa`` (short answers, greedy, exact match), ``day0_ppl`` (word perplexity of held-out
text), ``needle`` (``eval_needle``: RULER-style single needle with distractors, accuracy per length × depth),
``humaneval`` and ``agent_kv`` (``exec_tasks``: code run in the sandbox, the multi-turn tool environment; the
``code`` and ``agent`` keys, docs/references.md).
The target answers through the server the serve stage left running (``/v1/completions``: echo + logprobs for
log-likelihoods, greedy ``max_tokens`` for generations), or one started here like the serve stage does.

Pass rule per task, one-sided: target ≥ reference × (1 − ``eval_rtol``) (for perplexity, lower is better:
target ≤ reference × (1 + rtol)); the needle test also needs the target's accuracy at each length to reach
the reference's. The Wilson 95 % lower bound of each accuracy is reported beside it.

Options (the job's ``bench`` settings): ``eval_tasks`` (subset of TASKS; default DEFAULT_TASKS, without the two
acting tasks), ``eval_limit`` (first N documents per
task), ``eval_needle_lengths`` (prompt tokens; default: doubling from 256, then ``eval_needle_max_length``
(1024) itself, never past the served context), ``eval_needle_depths`` (percent), ``eval_needle_samples`` (items per
cell), ``eval_needle_distractors``, ``eval_concurrency`` (requests in flight), ``eval_code_limit`` (16, or
``eval_limit`` when smaller), ``eval_code_seed`` (a seeded sample instead of the first problems),
``eval_code_max_tokens``, ``eval_agent_episodes`` (8, or ``eval_limit`` when smaller).

A certify job carrying the portal's challenge runs only the drawn items through the served target and posts
their raw outputs (``challenge``): no reference is loaded, no score is claimed (docs/references.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agents.pipeline.stages.eval import challenge as eval_challenge
from agents.pipeline.stages.eval import exec_tasks
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.lm_backends import ReferenceLM, ServedError, ServedLM
from agents.pipeline.support.models import reference_model, tokenizer
from agents.pipeline.support.server import running_server, served_model, stop_server
from contract.suites import agent_env
from contract.suites import humaneval as code_suite
from contract.suites import needle as eval_needle
from contract.suites import tasks as eval_tasks
from contract.thresholds import DEFAULTS as THRESHOLD_DEFAULTS

# humaneval and agent_kv are asked for by name (``eval_tasks``): their reference side generates hundreds of tokens
# per item with transformers fp32 on the CPU, too slow to run for every model by default
DEFAULT_TASKS: tuple[str, ...] = (*eval_tasks.TASK_FILES, eval_needle.TASK)
TASKS: tuple[str, ...] = (*DEFAULT_TASKS, code_suite.TASK, agent_env.TASK)
DEFAULT_DEPTHS = (0, 25, 50, 75, 100)
NEEDLE_MAX_TOKENS = eval_needle.MAX_TOKENS
OPTION_BOUNDS: dict[str, tuple[int, int]] = {
    "eval_limit": (1, 100_000),
    "eval_needle_max_length": (64, 1 << 20),
    "eval_needle_samples": (1, 100),
    "eval_needle_distractors": (0, 11),
    "eval_concurrency": (1, 64),
    "eval_code_limit": (1, 164),
    "eval_code_seed": (0, 2**31 - 1),
    "eval_code_max_tokens": (16, 2048),
    "eval_agent_episodes": (1, 256),
}


def _int_option(bench: dict[str, Any], key: str, default: int | None) -> int | None:
    value = bench.get(key, default)
    if value is None:
        return None
    low, high = OPTION_BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise StageFailed(f"eval option {key}: {value!r} is not an integer in [{low}, {high}]")
    return value


def _int_list(bench: dict[str, Any], key: str, low: int, high: int) -> list[int] | None:
    value = bench.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",")]
        except ValueError:
            raise StageFailed(f"eval option {key}: {value!r} is not a comma-separated list of integers") from None
    if (not isinstance(value, list) or not value or len(value) > 64
            or not all(isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in value)):
        raise StageFailed(f"eval option {key}: {value!r} is not a list of 1 to 64 integers in [{low}, {high}]")
    return sorted(set(value))


def options(ctx: StageContext, context_length: int) -> dict[str, Any]:
    """The job's eval options with their defaults; a bad one is a StageFailed naming it and its bound."""
    bench = ctx.bench
    tasks = bench.get("eval_tasks", list(DEFAULT_TASKS))
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    if not isinstance(tasks, list) or not tasks or any(t not in TASKS for t in tasks):
        raise StageFailed(f"eval option eval_tasks: {tasks!r} must be a non-empty subset of {', '.join(TASKS)}")
    room = context_length - NEEDLE_MAX_TOKENS
    max_length = min(_int_option(bench, "eval_needle_max_length", 1024) or 1024, room)
    lengths = _int_list(bench, "eval_needle_lengths", 64, 1 << 20)
    if lengths is None:
        lengths = [n for n in (256 * 2**i for i in range(16)) if n < max_length] + [max_length]  # up to the bound
    elif lengths[-1] > room:
        raise StageFailed(f"eval option eval_needle_lengths: {lengths[-1]} tokens plus the answer's "
                          f"{NEEDLE_MAX_TOKENS} do not fit the served context of {context_length}")
    limit = _int_option(bench, "eval_limit", None)  # also bounds the code problems and agent episodes by default
    return {
        "tasks": [t for t in TASKS if t in tasks],
        "limit": limit,
        "needle_lengths": lengths,
        "needle_depths": _int_list(bench, "eval_needle_depths", 0, 100) or list(DEFAULT_DEPTHS),
        "needle_samples": _int_option(bench, "eval_needle_samples", 1),
        "needle_distractors": _int_option(bench, "eval_needle_distractors", 3),
        "concurrency": _int_option(bench, "eval_concurrency", 4),
        "code_limit": _int_option(bench, "eval_code_limit", min(16, limit or 16)),
        "code_seed": _int_option(bench, "eval_code_seed", None),
        "code_max_tokens": _int_option(bench, "eval_code_max_tokens", code_suite.MAX_TOKENS),
        "agent_episodes": _int_option(bench, "eval_agent_episodes", min(8, limit or 8)),
    }


def _rtol(ctx: StageContext) -> float:
    return float(ctx.thresholds.get("eval_rtol", THRESHOLD_DEFAULTS["eval_rtol"]))


def _served_context(target: ServedLM, ctx: StageContext) -> int:
    """The served model's context (``/v1/models``), else the config's."""
    import httpx

    try:
        card = target.client.get("/v1/models").json()["data"][0]
        if card.get("max_model_len"):
            return int(card["max_model_len"])
    except (ValueError, KeyError, IndexError, TypeError, httpx.HTTPError):
        pass  # an older server without max_model_len: the config's context
    return int(ctx.config.get("max_position_embeddings") or 2048)


def task_row(task: str, metric: str, reference: float, target: float, *, n: int, rtol: float,
             higher_is_better: bool, chance: float | None, correct: tuple[list[bool], list[bool]] | None,
             **extra: Any) -> dict[str, Any]:
    """One ``tasks`` entry: both sides' scores, the one-sided verdict, Wilson lower bounds of accuracies."""
    if higher_is_better:
        passed = target >= reference * (1 - rtol)
    else:
        passed = target <= reference * (1 + rtol)
    row: dict[str, Any] = {"task": task, "metric": metric, "reference": reference, "target": target, "n": n,
                           "higher_is_better": higher_is_better, "chance": chance, "passed": passed}
    if correct is not None:
        ref_ok, target_ok = correct
        row["wilson_low"] = eval_tasks.wilson_low(sum(target_ok), len(target_ok))
        row["wilson_low_reference"] = eval_tasks.wilson_low(sum(ref_ok), len(ref_ok))
        row["agreement"] = sum(a == b for a, b in zip(ref_ok, target_ok, strict=True)) / len(ref_ok)
    else:
        row["wilson_low"] = None
    row.update(extra)
    return row


def _step(ctx: StageContext, what: str) -> Any:
    """A progress callback for one (task, side): events "eval <task> <side>: done/total"."""
    return lambda done, total: ctx.progress(done, total, f"eval {what}")


def _run_task(name: str, lm_ref: ReferenceLM, target: ServedLM, encode: Any, opts: dict[str, Any], rtol: float,
              ctx: StageContext, prefix_token: int | None, context: int) -> dict[str, Any]:
    task = eval_tasks.load_task(name)
    req = eval_tasks.build_requests(task, encode, limit=opts["limit"], max_length=min(context, 2048),
                                    prefix_token=prefix_token)
    check = ctx.check_cancelled
    sides: dict[str, eval_tasks.Score] = {}
    lls: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    for side, lm in (("target", target), ("reference", lm_ref)):
        t0 = time.perf_counter()
        step = _step(ctx, f"{name} {side}")
        if req.loglikelihood:
            lls[side] = lm.loglikelihood(req.loglikelihood, step, check)
            sides[side] = eval_tasks.score(req, loglikelihoods=lls[side])
        else:
            generated = lm.generate(req.prompts, req.max_tokens, req.until, step, check)
            sides[side] = eval_tasks.score(req, generations=generated)
        seconds[side] = round(time.perf_counter() - t0, 3)
    ref, tgt = sides["reference"], sides["target"]
    extra: dict[str, Any] = {"seconds": seconds}
    if lls:  # token-level consistency of the two sides on the same requests
        extra["loglik_max_abs_diff"] = max(abs(a - b) for a, b in zip(lls["reference"], lls["target"], strict=True))
    if task.output_type == "loglikelihood_rolling":
        extra["token_perplexity_reference"] = eval_tasks.token_perplexity(req, ref.answers)
        extra["token_perplexity_target"] = eval_tasks.token_perplexity(req, tgt.answers)
        extra["tokens"] = req.tokens
    if task.output_type == "generate_until":
        extra["examples"] = [{"question": doc.get("question"), "answer": doc.get("answer"), "reference": r,
                              "target": t} for doc, r, t in list(zip(req.docs, ref.answers, tgt.answers,
                                                                    strict=True))[:5]]
    correct = (ref.correct, tgt.correct) if ref.correct is not None and tgt.correct is not None else None
    return task_row(name, task.metric, ref.value, tgt.value, n=len(req.docs), rtol=rtol,
                    higher_is_better=task.higher_is_better, chance=task.chance, correct=correct, **extra)


def _run_needle(lm_ref: ReferenceLM, target: ServedLM, tok: Any, opts: dict[str, Any], rtol: float,
                ctx: StageContext) -> tuple[dict[str, Any], dict[str, Any]]:
    lengths, depths = opts["needle_lengths"], opts["needle_depths"]

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    try:
        items = eval_needle.build_items(count, lengths, depths, opts["needle_samples"],
                                        distractors=opts["needle_distractors"])
    except ValueError as exc:
        raise StageFailed(f"eval needle: {exc}") from exc
    prompts = [tok(item.prompt, add_special_tokens=False)["input_ids"] for item in items]
    grids: dict[str, list[list[float]]] = {}
    seconds: dict[str, float] = {}
    answers: dict[str, list[str]] = {}
    for side, lm in (("target", target), ("reference", lm_ref)):
        t0 = time.perf_counter()
        answers[side] = lm.generate(prompts, NEEDLE_MAX_TOKENS, ["\n"], _step(ctx, f"needle {side}"),
                                    ctx.check_cancelled)
        seconds[side] = round(time.perf_counter() - t0, 3)
    correct = {side: [eval_needle.is_correct(i, a) for i, a in zip(items, answers[side], strict=True)]
               for side in answers}
    for side in answers:
        grids[side] = eval_needle.accuracy_grid(items, correct[side], lengths, depths)
    rows = []  # the grids again, one self-describing row per length (for pages: no indexing by position)
    for length, ref_row, tgt_row in zip(lengths, grids["reference"], grids["target"], strict=True):
        ref_acc, tgt_acc = sum(ref_row) / len(ref_row), sum(tgt_row) / len(tgt_row)
        cells = [{"depth": d, "reference": r, "target": t} for d, r, t in zip(depths, ref_row, tgt_row, strict=True)]
        tokens = max(i.tokens for i in items if i.length == length)
        rows.append({"length": length, "tokens": tokens, "reference": ref_acc, "target": tgt_acc,
                     "passed": tgt_acc + 1e-9 >= ref_acc, "cells": cells})
    exported = eval_needle.write_lm_eval_task(items, Path(ctx.workdir) / "eval_suites", NEEDLE_MAX_TOKENS)
    needle = {
        "lengths": lengths,
        "depths": depths,
        "depth_unit": "percent",
        "reference": grids["reference"],
        "target": grids["target"],
        "samples": opts["needle_samples"],
        "distractors": opts["needle_distractors"],
        "rows": rows,
        "passed": all(row["passed"] for row in rows),
        "lm_eval_task": str(exported),
        "seconds": seconds,
    }
    overall = task_row(eval_needle.TASK, "accuracy", sum(correct["reference"]) / len(items),
                       sum(correct["target"]) / len(items), n=len(items), rtol=rtol, higher_is_better=True,
                       chance=0.0, correct=(correct["reference"], correct["target"]))
    overall["passed"] = overall["passed"] and needle["passed"]
    return needle, overall


def _summary(rows: list[dict[str, Any]], needle: dict[str, Any] | None, rtol: float,
             acting: dict[str, dict[str, Any]] | None = None) -> str:
    parts = [f"{r['task']} {r['metric']} {r['target']:.4g} vs reference {r['reference']:.4g}" for r in rows]
    dropped = []
    code, agent = (acting or {}).get("code"), (acting or {}).get("agent")
    if code:
        parts.append(f"humaneval pass@1 {code['pass_at_1']['target']:.3g} vs reference "
                     f"{code['pass_at_1']['reference']:.3g}")
        if not code["passed"]:
            dropped.append(f"humaneval pass@1 {code['pass_at_1']['target']:.3g} is below reference "
                           f"{code['pass_at_1']['reference']:.3g} − {code['tolerance']:g}")
    if agent:
        parts.append(f"agent_kv success {agent['success']['target']:.3g} vs reference "
                     f"{agent['success']['reference']:.3g}, turn agreement {agent['turn_agreement']:.3g}")
        if not agent["passed"]:
            dropped.append(f"agent_kv success {agent['success']['target']:.3g} (reference "
                           f"{agent['success']['reference']:.3g} − {agent['tolerance']:g}) or turn agreement "
                           f"{agent['turn_agreement']:.3g} (at least {agent['min_turn_agreement']:g}) short")
    for r in rows:
        if not r["passed"]:
            sign = "1 − " if r["higher_is_better"] else "1 + "
            rel = "below" if r["higher_is_better"] else "above"
            dropped.append(f"task {r['task']} dropped: {r['metric']} {r['target']:.4g} is {rel} reference "
                           f"{r['reference']:.4g} × ({sign}{rtol:g})")
    for row in (needle or {}).get("rows", []):
        if not row["passed"]:
            dropped.append(f"needle at length {row['length']}: accuracy {row['target']:.3f} is below the "
                           f"reference's {row['reference']:.3f}")
    if dropped:
        return "outside tolerance: " + "; ".join(dropped)
    return "; ".join(parts)


def _run_acting(name: str, ctx: StageContext, sides: dict[str, Any], encode: Any, opts: dict[str, Any],
                context: int) -> dict[str, dict[str, Any]]:
    """``code`` (humaneval) or ``agent`` (agent_kv), with their thresholds from the job's table."""
    t = {**THRESHOLD_DEFAULTS, **ctx.thresholds}
    if name == code_suite.TASK:
        code = exec_tasks.run_code(ctx, sides, encode, opts, float(t["eval_code_pass_tol"]), context)
        ctx.emit("log", f"eval humaneval: pass@1 target {code['pass_at_1']['target']:.3g}, reference "
                        f"{code['pass_at_1']['reference']:.3g} ({'pass' if code['passed'] else 'FAIL'})")
        return {"code": code}
    agent = exec_tasks.run_agent(ctx, sides, encode, opts, float(t["eval_agent_success_tol"]),
                                 float(t["eval_agent_min_turn_agreement"]), context)
    ctx.emit("log", f"eval agent_kv: success target {agent['success']['target']:.3g}, reference "
                    f"{agent['success']['reference']:.3g}, turn agreement {agent['turn_agreement']:.3g} "
                    f"({'pass' if agent['passed'] else 'FAIL'})")
    return {"agent": agent}


def run(ctx: StageContext) -> dict[str, Any]:
    """The eval section: passed, rtol, endpoint, tasks (both sides per task), needle (accuracy grids), summary."""
    tok = tokenizer(ctx)
    if tok is None:
        raise StageFailed("eval needs the model's tokenizer (tokenizer.json), and the checkpoint has none")
    rtol = _rtol(ctx)
    url = running_server(ctx).url
    target = ServedLM(url, model=served_model(ctx))
    try:
        context = _served_context(target, ctx)
        if eval_challenge.has_challenge(ctx):  # the portal's drawn items only, raw outputs, no reference
            target.concurrency = _int_option(ctx.bench, "eval_concurrency", 4) or 4
            return eval_challenge.run(ctx, target, tok, url, context)
        opts = options(ctx, context)
        target.concurrency = opts["concurrency"]
        lm_ref = ReferenceLM(reference_model(ctx), tok)

        def encode(text: str) -> list[int]:
            return list(tok(text, add_special_tokens=False)["input_ids"])

        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        rows: list[dict[str, Any]] = []
        needle: dict[str, Any] | None = None
        acting: dict[str, dict[str, Any]] = {}
        sides = {"target": target, "reference": lm_ref}
        for name in opts["tasks"]:
            if name in (code_suite.TASK, agent_env.TASK):
                acting.update(_run_acting(name, ctx, sides, encode, opts, context))
                continue
            if name == eval_needle.TASK:
                needle, row = _run_needle(lm_ref, target, tok, opts, rtol, ctx)
            else:
                row = _run_task(name, lm_ref, target, encode, opts, rtol, ctx, prefix, context)
            rows.append(row)
            ctx.emit("log", f"eval {name}: {row['metric']} target {row['target']:.4g}, reference "
                            f"{row['reference']:.4g} ({'pass' if row['passed'] else 'FAIL'})")
    except ServedError as exc:
        raise StageFailed(f"the served target failed an eval request: {exc}") from exc
    except eval_tasks.TaskError as exc:
        raise StageFailed(f"eval suite: {exc}") from exc
    finally:
        target.close()
        stop_server(ctx)  # the eval stage is the server's last user
    passed = (all(r["passed"] for r in rows) and (needle is None or needle["passed"])
              and all(part["passed"] for part in acting.values()))
    section: dict[str, Any] = {
        "passed": passed,
        "rtol": rtol,
        "endpoint": url,
        "reference": "transformers float32 cpu",
        "tasks": rows,
        "needle": needle,
        "options": opts,
        "code": acting.get("code"),
        "agent": acting.get("agent"),
        "summary": _summary(rows, needle, rtol, acting),
        "notes": [] if eval_needle.TASK in opts["tasks"] else ["needle not run (eval_tasks): tier 6 needs it"],
    }
    return section

