"""``day0 jobs list|cancel|submit|watch`` against the live portal: tables and sentences, never Python reprs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agents.worker.client import describe_error
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from contract import queues
from tests.agents.conftest import unique_slug
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


def day0(portal_url: str, token: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAY0_TOKEN": token}  # the token by environment, as an operator would
    return subprocess.run([sys.executable, "-m", "day0cli", "jobs", *args, "--portal", portal_url], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def assert_sentence(text: str) -> None:
    assert text.strip() and not any(mark in text for mark in ("{'", "['", "ErrorDetail", "Traceback")), text


@pytest.fixture
def jobs(portal):  # noqa: ANN001, ANN201
    org = OrganizationFactory(slug=unique_slug("org"))
    hardware = HardwareFactory(slug=unique_slug("hw"), dtypes=["float32", "bfloat16", "float8_e4m3fn"])
    model = ModelReleaseFactory(slug=unique_slug("m"), organization=org)
    token = make_token(organization=org)
    queued = JobFactory(model=model, hardware=hardware, state=JobState.QUEUED)
    stuck = JobFactory(model=model, hardware=hardware, state=JobState.DISPATCHED, attempts=1,
                       dispatched_at=timezone.now() - timedelta(minutes=10))
    yield portal.url, token.secret, model, hardware, queued, stuck
    from day0portal.celery import app

    with app.connection_for_write() as conn:  # leave no message behind in hw.<slug>
        conn.default_channel.queue_purge(queues.hardware_queue(hardware.slug))


def test_jobs_list_prints_a_table_with_why_a_job_waits_and_filters_by_state(jobs) -> None:  # noqa: ANN001
    url, token, model, hardware, queued, stuck = jobs
    listed = day0(url, token, "list", "--model", model.slug)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert set(rows) == {str(queued.pk), str(stuck.pk)}, listed.stdout
    assert "queued" in rows[str(queued.pk)]
    assert "dispatched 10 min ago" in rows[str(stuck.pk)] and f"no agent of {hardware.slug} is online" in rows[
        str(stuck.pk)]
    only = day0(url, token, "list", "--model", model.slug, "--state", "dispatched")
    assert [line.split()[0] for line in only.stdout.splitlines()[1:]] == [str(stuck.pk)]
    bad = day0(url, token, "list", "--limit", "0")
    assert bad.returncode == 2 and "0 is outside 1-500" in bad.stderr


def test_jobs_cancel_cancels_once_then_explains_in_a_sentence(jobs) -> None:  # noqa: ANN001
    url, token, _, _, queued, _ = jobs
    done = day0(url, token, "cancel", str(queued.pk))
    assert done.returncode == 0 and done.stdout.strip() == f"job {queued.pk} cancelled", done.stderr
    assert Job.objects.get(pk=queued.pk).state == JobState.CANCELLED
    again = day0(url, token, "cancel", str(queued.pk))
    assert again.returncode == 1
    assert f"the portal answered 409: job {queued.pk} is cancelled" in again.stderr
    assert_sentence(again.stderr)


def test_jobs_submit_takes_the_dtype_names_estimate_takes_and_refuses_in_sentences(jobs) -> None:  # noqa: ANN001
    url, token, model, hardware, _, _ = jobs
    submitted = day0(url, token, "submit", "--model", model.slug, "--hardware", hardware.slug, "--dtype", "fp8",
                     "--stages", "plan")
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.split()[1])
    assert Job.objects.get(pk=job_id).spec["dtype"] == "float8_e4m3fn"
    refused = day0(url, token, "submit", "--model", model.slug, "--hardware", hardware.slug, "--dtype", "float128")
    assert refused.returncode == 1 and "the portal answered 400: dtype: unknown dtype 'float128'" in refused.stderr
    assert_sentence(refused.stderr)


def test_jobs_submit_pins_a_layout_and_says_when_the_plan_spans_several_nodes(jobs) -> None:  # noqa: ANN001
    url, token, model, hardware, _, _ = jobs  # 8 devices per node: tp=2 fits one, tp=8 pp=2 (16) takes two
    submitted = day0(url, token, "submit", "--model", model.slug, "--hardware", hardware.slug, "--stages", "plan",
                     "--tp", "2")
    assert submitted.returncode == 0 and "spans" not in submitted.stdout, submitted.stderr
    job = Job.objects.get(pk=int(submitted.stdout.split()[1]))
    assert (job.spec["tp"], job.spec["pp"], job.nodes) == (2, None, 1)
    wide = day0(url, token, "submit", "--model", model.slug, "--hardware", hardware.slug, "--stages", "plan",
                "--tp", "8", "--pp", "2")
    assert wide.returncode == 0, wide.stderr
    assert "its plan spans 2 nodes: it runs on 2 agents at once" in wide.stdout, wide.stdout
    refused = day0(url, token, "submit", "--model", model.slug, "--hardware", hardware.slug, "--tp", "0")
    assert refused.returncode == 2 and "0 is outside 1-4096" in refused.stderr


def test_jobs_watch_says_why_a_dispatched_job_waits(jobs) -> None:  # noqa: ANN001
    url, token, _, hardware, _, stuck = jobs
    env = {**os.environ, "DAY0_TOKEN": token}
    watch = subprocess.Popen([sys.executable, "-m", "day0cli", "jobs", "watch", str(stuck.pk), "--portal",
                              url], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and not line.startswith("waiting:"):
            line = watch.stdout.readline()
        assert line.startswith("waiting: dispatched 10 min ago"), line
        assert f"no agent of {hardware.slug} is online" in line
    finally:
        watch.kill()
        watch.wait()


def test_portal_errors_read_as_sentences() -> None:
    detail = {"dtype": ["unknown dtype 'x'"], "bench": {"input_len": ["must be an integer from 1 to 1048576"]},
              "non_field_errors": ["a stage is listed twice"]}
    assert describe_error(detail) == ("dtype: unknown dtype 'x'; bench.input_len: must be an integer from 1 to "
                                      "1048576; a stage is listed twice")
    assert describe_error({"detail": "job 4 is cancelled"}) == "job 4 is cancelled"
