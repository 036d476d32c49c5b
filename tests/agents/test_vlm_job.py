"""A vision-language release through the real job chain (REST POST -> dispatch -> ``day0 agent`` -> pipeline ->
evidence): the portal judges it as a model that takes images, and the cell reaches tier >= 4 with its image
path answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.runtime.testing.make_model import cached_model
from apps.accounts.choices import Scope
from apps.evidence.models import StageResult
from apps.jobs.models import Job
from apps.matrix.models import Cell
from tests.agents.conftest import model_config, unique_slug, wait_for
from tests.agents.test_job_flow import state_of, submit
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_a_vlm_job_reaches_tier_4_with_its_image_path(portal, start_agent, tmp_path: Path) -> None:  # noqa: ANN001
    from types import SimpleNamespace

    model_dir = cached_model("llava")
    org = OrganizationFactory(slug=unique_slug("org"))
    model = ModelReleaseFactory(slug=unique_slug("tiny-llava"), organization=org, config=model_config(model_dir),
                                modalities=["text", "image"])
    hardware = HardwareFactory(slug=unique_slug("hw"), memory_bytes=8 * 10**9, devices_per_node=1,
                               dtypes=["float32", "bfloat16"])
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / model.slug).symlink_to(model_dir)
    cell = SimpleNamespace(model=model, hardware=hardware, submit=make_token(organization=org))
    agent_token = make_token(organization=org, scopes=[Scope.AGENT], hardware=hardware, name="agent")
    stages = ["plan", "load", "inventory", "align", "serve", "bench"]
    job_id = submit(portal.url, cell, stages)
    agent = start_agent(hardware.slug, agent_token.secret, models_dir=models_dir)
    wait_for(lambda: state_of(job_id) in ("succeeded", "failed"), 480, "the job to finish", agent)
    job = Job.objects.get(pk=job_id)
    assert job.state == "succeeded", (job.failed_stage, job.error)
    serve = StageResult.objects.get(job_id=job_id, stage="serve")
    assert serve.verdict == "pass" and serve.section["image_path_ok"] is True
    align = StageResult.objects.get(job_id=job_id, stage="align")
    assert align.section["vision"]["passed"] is True
    assert Cell.objects.get(model=model, hardware=hardware).tier >= 4
