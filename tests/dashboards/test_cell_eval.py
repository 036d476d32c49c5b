"""The cell page's evaluation card: per-task scores of both sides and the needle heatmap (length × depth),
from an eval section in the shape the eval stage writes, judged and stored by the portal's own service."""

from __future__ import annotations

import re

import pytest

from agents.pipeline.stages.eval import stage as eval_stage
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _section(needle_target: list[list[float]]) -> dict:
    rows = [
        eval_stage.task_row("day0_mc", "acc", 0.48, 0.48, n=231, rtol=0.05, higher_is_better=True, chance=0.25,
                            correct=([True] * 111 + [False] * 120, [True] * 111 + [False] * 120)),
        eval_stage.task_row("day0_ppl", "word_perplexity", 21.5, 21.5, n=8, rtol=0.05, higher_is_better=False,
                            chance=None, correct=None),
    ]
    reference = [[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    return {"passed": needle_target == reference, "rtol": 0.05, "endpoint": "http://127.0.0.1:8000",
            "reference": "transformers float32 cpu", "tasks": rows, "summary": "day0_mc acc 0.48 vs reference 0.48",
            "needle": {"lengths": [256, 512], "depths": [0, 50, 100], "depth_unit": "percent",
                       "reference": reference, "target": needle_target, "samples": 1, "distractors": 3}}


def test_cell_page_shows_both_sides_per_task_and_the_needle_heatmap(world, client_for) -> None:
    from apps.evidence.services import do_record_stage_results

    job = JobFactory(model=world.model, hardware=world.hardware)
    do_record_stage_results(job, {"eval": _section([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])})
    html = client_for(None).get(f"/cells/{world.model.slug}/{world.hardware.slug}/").content.decode()
    card = html[html.index('id="evaluation"'):]
    card = card[: card.index("</section>")]
    assert 'data-task="day0_mc"' in card and "0.48" in card and "231" in card and "(lower is better)" in card
    heat = card[card.index('id="needle-heatmap"'):]
    cells = re.findall(r'data-target="([\d.]+)" data-reference="([\d.]+)"', heat)
    assert cells == [("1.000", "1.000"), ("1.000", "1.000"), ("0.000", "0.000"),
                     ("1.000", "1.000"), ("0.000", "0.000"), ("0.000", "1.000")]  # [length][depth], paired
    assert heat.count('class="num heat below"') == 1  # the one cell where the target fell below the reference
    assert ">256<" in heat and ">512<" in heat and "(percent)" in heat


def test_seeded_evidence_with_only_the_contract_keys_renders_too(world, client_for) -> None:
    from apps.evidence.models import StageResult

    seen = set()
    for hardware in (world.hardware, world.other_hardware):
        html = client_for(None).get(f"/cells/{world.model.slug}/{hardware.slug}/").content.decode()
        card = html[html.index('id="evaluation"'):]
        card = card[: card.index("</section>")]
        stored = StageResult.objects.filter(job__model=world.model, job__hardware=hardware, stage="eval").exists()
        seen.add(stored)
        if stored:  # seed_evidence writes lengths/depths/reference/target only: the heatmap pairs them by position
            assert 'id="needle-heatmap"' in card and card.count('class="num heat') >= 3
        else:
            assert "No evaluation yet." in card
    assert seen == {True, False}


def test_cell_page_shows_the_code_and_agent_tasks_beside_the_reference(world, client_for) -> None:
    from apps.evidence.services import do_record_stage_results
    from contract.suites import agent_env
    from contract.suites import humaneval as code_suite

    problems = code_suite.problems()[:4]
    item = lambda ok: {"passed": ok, "status": "passed" if ok else "failed", "sha256": "0" * 64}  # noqa: E731
    code = code_suite.score(problems, [item(True), item(True), item(False), item(False)],
                            [item(True), item(False), item(False), item(False)], tolerance=0.05)
    episodes = [agent_env.Episode.from_seed(s) for s in range(2)]
    agent = agent_env.score(episodes, episodes, tolerance=0.1, min_agreement=0.8)
    section = {**_section([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]), "code": code, "agent": agent}
    job = JobFactory(model=world.model, hardware=world.hardware)
    do_record_stage_results(job, {"eval": section})
    html = client_for(None).get(f"/cells/{world.model.slug}/{world.hardware.slug}/").content.decode()
    card = html[html.index('id="eval-acting"'):]
    card = card[: card.index("</table>")]
    humaneval = card[card.index('data-task="humaneval"'):card.index('data-task="agent_kv"')]
    assert 'class="failed"' in humaneval and "0.500" in humaneval and "0.250" in humaneval and "✗ dropped" in humaneval
    agent_row = card[card.index('data-task="agent_kv"'):]
    assert "turn agreement 1.00" in agent_row and "✓ pass" in agent_row
