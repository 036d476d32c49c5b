"""The job spec the portal publishes (apps/jobs/dispatch.py) is the contract's (contract/jobspec.py): the agent
reads the job's own values back from it, and a stored spec an agent could not read is refused before it is sent,
naming the key."""

from __future__ import annotations

import pytest

from apps.jobs.choices import JobState
from apps.jobs.dispatch import send_job, task_payload
from apps.jobs.services import do_transition_job
from contract.jobspec import JobSpec, JobSpecError
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory

pytestmark = pytest.mark.django_db


def test_the_agent_reads_the_jobs_values_from_the_payload() -> None:
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    job = JobFactory(model=model, hardware=hardware, state=JobState.QUEUED,
                     spec={"stages": ["plan"], "dtype": "float32", "tp": 1, "thresholds": {"op_cosine": 0.99}})
    do_transition_job(job, JobState.DISPATCHED)
    spec = JobSpec.from_dict(task_payload(job))
    assert (spec.job, spec.attempt, spec.nonce, spec.purpose) == (job.pk, job.attempts, job.nonce, job.purpose)
    assert spec.model["slug"] == model.slug and spec.model["config"] == model.config
    assert spec.hardware["slug"] == hardware.slug and spec.hardware["memory_bytes"] == hardware.memory_bytes
    assert (spec.stages, spec.dtype, spec.tp, spec.thresholds) == (["plan"], "float32", 1, {"op_cosine": 0.99})


def test_a_stored_spec_an_agent_could_not_read_is_not_sent() -> None:
    job = JobFactory(state=JobState.QUEUED, spec={"stages": "plan", "dtype": "float32"})
    do_transition_job(job, JobState.DISPATCHED)
    with pytest.raises(JobSpecError, match="stages must be a list of stage names"):
        send_job(job)
