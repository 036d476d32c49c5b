"""The challenge pool (docs/references.md): every item the portal may ask an agent to answer, built from the
bundled eval suites (``contract.suites``, rendered the way ``suites.tasks`` and the harness render them) and a fixed
set of end-to-end prompts. Each item has a stable ``id``; the pool's ``version`` is the sha256 of its canonical
JSON, answers included, so any change to an item, an answer or a metric option is a new version (and a new
reference run for every release).

An item has two parts: what an agent receives (``Pool.items``: no answers) and what only the portal keeps
(``Pool.answers``). Needles are not in the stored pool: ``needle_items`` makes fresh keys and values with
``secrets`` for every challenge and every reference run.

Pure: standard library and yaml (the portal imports it; no torch, no Django)."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from contract.suites import agent_env
from contract.suites import humaneval as code_suite
from contract.suites import needle as eval_needle
from contract.suites import tasks as eval_tasks

KINDS: tuple[str, ...] = ("e2e", "mc", "qa", "ppl", "needle", "code", "agent")
POOL_KINDS: tuple[str, ...] = ("e2e", "mc", "qa", "ppl", "code", "agent")  # the stored pool; needles are fresh
ACTING_KINDS: tuple[str, ...] = ("code", "agent")  # tasks that act: a program run, an episode played
# The acting kinds' pools are bounded by what the fp32 CPU reference run generates for every item: HumanEval's
# first CODE_POOL problems (up to 384 tokens each) and agent_kv's episodes of seeds 0 .. AGENT_POOL - 1 (up to
# 8 turns of 48 tokens each).
CODE_POOL = 20
AGENT_POOL = 16
E2E_MAX_TOKENS = 16
TOP_K = 5
NEEDLE_MAX_TOKENS = eval_needle.MAX_TOKENS  # the eval stage's answer budget for a needle
NEEDLE_DEPTHS: tuple[int, ...] = (0, 25, 50, 75, 100)
NEEDLE_MAX_LENGTH = 1024
NEEDLE_DISTRACTORS = 3

# (prompt, chat): greedy continuations compared token by token with the reference. The first three are the align
# stage's own prompts (agents/pipeline/align_e2e.py); chat prompts are rendered as one user message through the
# model's chat template.
E2E_PROMPTS: tuple[tuple[str, bool], ...] = (
    ("The harbour woke before the sun, and", False),
    ("Question: Which planet is closest to the sun?\nAnswer:", False),
    ("Write one sentence about rivers.", True),
    # plain text
    ("Once upon a time, in a village at the edge of a great forest,", False),
    ("The recipe calls for two cups of flour, a pinch of salt and", False),
    ("In the spring of that year the river flooded the lower town, and", False),
    ("The old clock in the hallway struck midnight. Upstairs,", False),
    ("Scientists have long wondered why some birds migrate thousands of miles while others", False),
    ("The committee met on Tuesday to discuss the budget. After a long debate,", False),
    ("My grandmother kept a small notebook in which she wrote", False),
    ("The train was late again, so Maria decided to", False),
    ("Photosynthesis is the process by which plants", False),
    ("The first rule of safe cycling in a city is", False),
    ("On the far side of the mountain there was a lake so clear that", False),
    ("The museum's newest exhibit features", False),
    ("Dear Sir or Madam,\n\nI am writing to", False),
    ("Chapter 1\n\nThe letter arrived on a grey Monday morning.", False),
    # questions and short answers
    ("Question: What is the boiling point of water at sea level in degrees Celsius?\nAnswer:", False),
    ("Question: Who wrote the play Romeo and Juliet?\nAnswer:", False),
    ("Question: How many days are there in a leap year?\nAnswer:", False),
    ("Q: What is the largest ocean on Earth?\nA:", False),
    ("Q: What gas do humans need to breathe?\nA:", False),
    ("The capital of Australia is", False),
    ("12 + 7 =", False),
    ("A list of three primary colours: red,", False),
    ("Translate to French: 'Good morning, my friend.'\nFrench:", False),
    ("The opposite of 'ancient' is", False),
    # code
    ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
    ("import json\n\n\ndef load_config(path):\n", False),
    ("# Python: sort a list of words by their length\nwords = [\"pear\", \"fig\", \"banana\"]\n", False),
    ("SELECT name, email FROM users WHERE", False),
    ("function add(a, b) {\n", False),
    ("#include <stdio.h>\n\nint main(void) {\n", False),
    ("for i in range(10):\n    if i % 2 == 0:\n", False),
    ("<html>\n  <head>\n    <title>", False),
    ("$ git commit -m \"", False),
    # lists, structure, numbers
    ("Shopping list:\n1. Milk\n2. Eggs\n3.", False),
    ("Monday, Tuesday, Wednesday,", False),
    ("1, 2, 4, 8, 16,", False),
    ("{\"name\": \"Alice\", \"age\": 30, \"city\":", False),
    # chat-rendered
    ("What is the capital of Canada?", True),
    ("Give me a short tip for sleeping better.", True),
    ("Explain what a rainbow is in one sentence.", True),
    ("Write a haiku about the sea.", True),
    ("How do I boil an egg?", True),
    ("Name three fruits that are red.", True),
    ("Summarise the story of Cinderella in one sentence.", True),
    ("What does a compiler do?", True),
)


class PoolError(ValueError):
    """A pool item, an id or a needle setting is malformed (the message names it)."""


@dataclass(frozen=True)
class Pool:
    """The pool: agent-facing items and portal-only answers by kind and id, and the pool's version."""

    version: str
    items: Mapping[str, Mapping[str, Mapping[str, Any]]]  # kind -> id -> item as the agent receives it
    answers: Mapping[str, Mapping[str, Mapping[str, Any]]]  # kind -> id -> what only the portal keeps

    def ids(self, kind: str) -> list[str]:
        return sorted(self.items.get(kind, {}))

    def agent_items(self, kind: str, ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The agent-facing items of ``kind`` (all, or ``ids`` in that order), copies without answers."""
        chosen = self.ids(kind) if ids is None else list(ids)
        return [json.loads(json.dumps(self.items[kind][i])) for i in chosen]


def canonical(value: Any) -> str:
    """The canonical JSON of ``value``: sorted keys, no spaces, UTF-8 as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _doc_id(task: eval_tasks.Task, doc: Mapping[str, Any], index: int) -> str:
    value = doc.get("id")
    if not isinstance(value, str) or not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", value):
        raise PoolError(f"{task.path.name}: document {index} has no usable id (got {value!r})")
    return value


def _mc(task: eval_tasks.Task) -> tuple[dict[str, dict], dict[str, dict]]:
    cfg, items, answers = task.config, {}, {}
    delimiter = cfg.get("target_delimiter", " ")
    for i, doc in enumerate(task.docs):
        item_id = _doc_id(task, doc, i)
        context = cfg.get("description", "") + eval_tasks.field_of(cfg["doc_to_text"], doc)
        choices = [delimiter + str(c) for c in eval_tasks.field_of(cfg["doc_to_choice"], doc)]
        items[item_id] = {"id": item_id, "context": context, "choices": choices}
        answers[item_id] = {"answer": int(eval_tasks.field_of(cfg["doc_to_target"], doc)), "task": task.name}
    return items, answers


def _qa(task: eval_tasks.Task) -> tuple[dict[str, dict], dict[str, dict]]:
    cfg, items, answers = task.config, {}, {}
    gen = cfg.get("generation_kwargs") or {}
    until, max_tokens = [str(s) for s in gen.get("until") or []], int(gen.get("max_gen_toks", 256))
    options = {k: v for k, v in task.metric_options.items()
               if k in ("ignore_case", "ignore_punctuation", "regexes_to_ignore")}
    for i, doc in enumerate(task.docs):
        item_id = _doc_id(task, doc, i)
        prompt = cfg.get("description", "") + eval_tasks.field_of(cfg["doc_to_text"], doc)
        items[item_id] = {"id": item_id, "prompt": prompt, "until": until, "max_tokens": max_tokens}
        answers[item_id] = {"answer": str(eval_tasks.field_of(cfg["doc_to_target"], doc)), "options": options,
                            "task": task.name}
    return items, answers


def _ppl(task: eval_tasks.Task) -> tuple[dict[str, dict], dict[str, dict]]:
    cfg, items, answers = task.config, {}, {}
    for i, doc in enumerate(task.docs):
        item_id = _doc_id(task, doc, i)
        text = str(eval_tasks.field_of(cfg["doc_to_target"], doc))
        items[item_id] = {"id": item_id, "text": text}
        answers[item_id] = {"words": len(re.split(r"\s+", text)), "task": task.name}  # as the harness counts
    return items, answers


def _e2e() -> tuple[dict[str, dict], dict[str, dict]]:
    items = {}
    for i, (prompt, chat) in enumerate(E2E_PROMPTS):
        item_id = f"e2e-{i:03d}"
        items[item_id] = {"id": item_id, "prompt": prompt, "chat": chat, "max_tokens": E2E_MAX_TOKENS}
    return items, {item_id: {} for item_id in items}


def _code() -> tuple[dict[str, dict], dict[str, dict]]:
    items, answers = {}, {}
    for i, problem in enumerate(code_suite.problems()[:CODE_POOL]):
        item_id = f"humaneval-{i:03d}"
        items[item_id] = {"id": item_id, "task_id": problem.task_id, "prompt": problem.prompt,
                          "stop": list(code_suite.STOP), "max_tokens": code_suite.MAX_TOKENS}
        answers[item_id] = {"task": code_suite.TASK, "task_id": problem.task_id}
    return items, answers


def _agent() -> tuple[dict[str, dict], dict[str, dict]]:
    items, answers = {}, {}
    for seed in range(AGENT_POOL):
        item_id = f"agent-{seed:03d}"
        items[item_id] = {"id": item_id, "seed": seed, "max_turns": agent_env.MAX_TURNS,
                          "max_tokens": agent_env.ACTION_MAX_TOKENS}
        answers[item_id] = {"task": agent_env.TASK, "goal": agent_env.Episode.from_seed(seed).task}
    return items, answers


def build_pool() -> Pool:
    """The pool from the bundled suites and prompts (deterministic: the same files give the same version)."""
    items: dict[str, dict[str, dict]] = {}
    answers: dict[str, dict[str, dict]] = {}
    items["e2e"], answers["e2e"] = _e2e()
    items["mc"], answers["mc"] = _mc(eval_tasks.load_task("day0_mc"))
    items["qa"], answers["qa"] = _qa(eval_tasks.load_task("day0_qa"))
    items["ppl"], answers["ppl"] = _ppl(eval_tasks.load_task("day0_ppl"))
    items["code"], answers["code"] = _code()
    items["agent"], answers["agent"] = _agent()
    seen: set[str] = set()
    for kind in POOL_KINDS:
        for item_id in items[kind]:
            if item_id in seen:
                raise PoolError(f"pool id {item_id!r} is used twice")
            seen.add(item_id)
    body = {kind: [{"item": items[kind][i], "answer": answers[kind][i]} for i in sorted(items[kind])]
            for kind in POOL_KINDS}
    version = hashlib.sha256(canonical(body).encode()).hexdigest()
    return Pool(version=version, items=items, answers=answers)


@lru_cache(maxsize=1)
def pool() -> Pool:
    """The bundled pool, built once per process."""
    return build_pool()


# --- needles ------------------------------------------------------------------------------------------------

def needle_lengths(context_length: int | None) -> list[int]:
    """Prompt lengths of the needle grid for a model: doubling from 256 up to 1024 tokens, never past the
    model's context less the answer's budget (the eval stage's default grid)."""
    room = (context_length or NEEDLE_MAX_LENGTH + NEEDLE_MAX_TOKENS) - NEEDLE_MAX_TOKENS
    top = min(NEEDLE_MAX_LENGTH, room)
    if top < 64:
        return []
    return [n for n in (256 * 2**i for i in range(3)) if n < top] + [top]


def needle_items(lengths: Sequence[int], depths: Sequence[int] = NEEDLE_DEPTHS, samples: int = 1, *,
                 distractors: int = NEEDLE_DISTRACTORS) -> list[dict[str, Any]]:
    """Fresh needle items ``{"id", "length", "depth", "key", "value", "distractors": [{"key", "value"}]}``: keys
    from the haystack's, seven-digit values from ``secrets``, all distinct within an item. The answer is
    ``value``; the agent builds the prompt with its tokenizer (``eval_needle``)."""
    _, keys = eval_needle.haystack_data()
    if not 0 <= distractors < len(keys):
        raise PoolError(f"needle distractors must be from 0 to {len(keys) - 1}, got {distractors}")
    rng = secrets.SystemRandom()
    out = []
    for length in lengths:
        for depth in depths:
            if not 0 <= depth <= 100:
                raise PoolError(f"needle depth {depth} is outside 0..100 (percent)")
            for sample in range(samples):
                chosen = rng.sample(keys, distractors + 1)
                values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), distractors + 1)]
                out.append({"id": f"needle-{length}-{depth}-{sample}", "length": int(length), "depth": int(depth),
                            "key": chosen[0], "value": values[0],
                            "distractors": [{"key": k, "value": v}
                                            for k, v in zip(chosen[1:], values[1:], strict=True)]})
    return out


def needle_answers(items: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the portal keeps of needle items: each id's value and length."""
    return {str(i["id"]): {"value": str(i["value"]), "length": int(i["length"])} for i in items}


def reference_pool(the_pool: Pool, needles: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``reference_pool`` of a reference job's payload: every pool item as an agent receives it, plus the
    reference run's own fresh needles."""
    out: dict[str, Any] = {"pool_version": the_pool.version, "top_k": TOP_K}
    for kind in POOL_KINDS:
        out[kind] = the_pool.agent_items(kind)
    out["needle"] = [dict(n) for n in needles]
    return out
