"""Jobs of named engines posting evidence, for the engine-cell tests (portal and browser)."""

from __future__ import annotations

from typing import Any

from apps.core import events
from apps.evidence.ingest import do_record_job_results
from apps.jobs.choices import JobState
from tests.factories import JobFactory
from tests.portal.reports import bound, passing


def spec(name: str, version: str) -> dict[str, Any]:
    return {"stages": ["plan", "load", "serve", "bench", "env", "eval"], "dtype": "bfloat16",
            "engine": {"name": name, "version": version, "executable": "vllm", "capabilities": {},
                       "command": "vllm serve {model_path} --port {port}"}}


def run_job(model, hardware, stages: dict[str, dict[str, Any]], spec: dict[str, Any] | None = None,
         state: str = JobState.SUCCEEDED):
    """A job of ``spec``'s engine posting ``stages``, then settled in ``state`` (the cell follows both)."""
    job = JobFactory(model=model, hardware=hardware, **({"spec": spec} if spec else {}))
    do_record_job_results(job, bound(job, {"stages": stages}))
    type(job).objects.filter(pk=job.pk).update(state=state)
    events.send_now(events.cell_inputs_changed, model_id=model.pk, hardware_id=hardware.pk, reason="", history=None)
    return job


def vllm_serve(version: str, threads: str) -> dict[str, Any]:
    serve = passing("serve")
    serve["engine"] = {"name": "vllm", "version": version, "ref": f"vllm@{version}", "reported_version": version,
                       "command": ["vllm", "serve", "/models/m", "--port", "8100", "--dtype", "bfloat16"],
                       "served_model": "m", "pid": 4242, "environment": {"OMP_NUM_THREADS": threads}}
    return serve
