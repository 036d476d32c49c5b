"""A job whose plan spans two hosts through the real chain: REST POST → the portal reserves two idle agents of
the hardware and sends each its node on its own queue (Redis) → two ``day0 agent`` processes → node 0 claims the
job and runs the pipeline, node 1 claims its node and runs its ranks; their ranks meet over gloo at node 0's
reported address → node 0's results and state, node 1's stage events on its node row."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from agents.runtime.testing.make_model import cached_model
from apps.accounts.choices import Scope
from apps.evidence.models import StageResult
from apps.jobs.models import Job, JobNode
from tests.agents.conftest import model_config, unique_slug, wait_for
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_a_two_node_job_runs_on_two_agents_and_node_0_reports_every_rank(portal, start_agent,
                                                                          tmp_path: Path) -> None:  # noqa: ANN001
    model_dir = cached_model("llama")
    org = OrganizationFactory(slug=unique_slug("org"))
    model = ModelReleaseFactory(slug=unique_slug("tiny"), organization=org, config=model_config(model_dir))
    hardware = HardwareFactory(slug=unique_slug("hw"), memory_bytes=8 * 10**9, devices_per_node=1,
                               dtypes=["float32"])
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / model.slug).symlink_to(model_dir)
    submit = make_token(organization=org)
    token = make_token(organization=org, scopes=[Scope.AGENT], hardware=hardware, name="agent")
    env = {"DAY0_AGENT_ADDRESS": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    agents = [start_agent(hardware.slug, token.secret, models_dir=models_dir, hostname=f"node{i}-{hardware.slug}",
                          extra_env=env) for i in range(2)]
    wait_for(lambda: hardware.agents.filter(last_heartbeat_at__isnull=False).count() == 2, 120, "two agents online",
             agents[0])
    response = httpx.post(f"{portal.url}/api/v1/jobs/", headers={"Authorization": f"Token {submit.secret}"},
                          json={"model": model.slug, "hardware": hardware.slug, "stages": ["plan", "load"],
                                "dtype": "float32", "pp": 2}, timeout=30)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    assert response.json()["nodes"] == 2  # pp=2 on one device per node: the plan spans two hosts
    wait_for(lambda: Job.objects.get(pk=job_id).state in ("succeeded", "failed"), 300, "the job to finish", agents[0])
    job = Job.objects.get(pk=job_id)
    assert job.state == "succeeded", (job.failed_stage, job.error, agents[0].log()[-3000:], agents[1].log()[-3000:])
    nodes = {n.rank: n for n in JobNode.objects.filter(job=job, attempt=job.attempts)}
    assert job.agent_id == nodes[0].agent_id != nodes[1].agent_id
    assert (nodes[0].master_addr, nodes[1].master_addr) == ("127.0.0.1", "127.0.0.1")
    load = StageResult.objects.get(job=job, stage="load").section
    assert [r["rank"] for r in load["ranks"]] == [0, 1] and load["pp"] == 2  # node 1's rank reached node 0
    wait_for(lambda: JobNode.objects.get(pk=nodes[1].pk).state == "finished", 60, "node 1 to finish", agents[1])
    finished = [e["data"]["stage"] for e in JobNode.objects.get(pk=nodes[1].pk).events
                if e["kind"] == "stage_finished"]
    assert finished == ["load"]  # node 1's stage events, on its node row
