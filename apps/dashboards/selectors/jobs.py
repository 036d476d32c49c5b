"""The jobs list: every job the requester may see, filtered by state, model, hardware and organization, newest
first, one page at a time (a count and a page query whatever the number of jobs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db.models import OuterRef, Subquery

from apps.accounts.access import Actor
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from apps.jobs.selectors import visible_jobs

JOBS_PER_PAGE = 50
STATES = tuple(JobState.values)


@dataclass(frozen=True)
class JobFilters:
    state: str = ""
    model: str = ""
    hardware: str = ""
    organization: str = ""

    @classmethod
    def from_params(cls, params: Any) -> JobFilters:
        """Unknown states are ignored (the page keeps working); slugs are bounded."""
        state = (params.get("state") or "").strip()
        return cls(state=state if state in STATES else "", model=(params.get("model") or "").strip()[:100],
                   hardware=(params.get("hardware") or "").strip()[:64],
                   organization=(params.get("organization") or "").strip()[:64])

    def query(self) -> str:
            return urlencode({k: v for k, v in self.__dict__.items() if v})


def job_list(actor: Actor, filters: JobFilters, page: Any = 1, *, per_page: int = JOBS_PER_PAGE) -> Page:
    """One page of the visible jobs matching ``filters`` (newest first), rows carrying model, hardware,
    organization and requester."""
    jobs = visible_jobs(actor).select_related("model", "hardware", "organization", "requested_by").only(
        "id", "state", "purpose", "failed_stage", "created_at", "finished_at", "attempts", "spec", "model__slug",
        "model__name", "hardware__slug", "hardware__name", "organization__slug", "requested_by__username")
    if filters.state:
        jobs = jobs.filter(state=filters.state)
    if filters.model:
        jobs = jobs.filter(model__slug=filters.model)
    if filters.hardware:
        jobs = jobs.filter(hardware__slug=filters.hardware)
    if filters.organization:
        jobs = jobs.filter(organization__slug=filters.organization)
    return Paginator(jobs.order_by("-created_at", "-id"), per_page).get_page(page)


def previous_job_ids(jobs: list[Job]) -> dict[int, int]:
    """job id -> the job before it in the same cell and of the same purpose (for "compare with previous"; a
    certify job is never compared with a reference run), in one query."""
    if not jobs:
        return {}
    earlier = Job.objects.filter(model_id=OuterRef("model_id"), hardware_id=OuterRef("hardware_id"),
                                 purpose=OuterRef("purpose"), created_at__lt=OuterRef("created_at")).order_by("-created_at", "-id").values("id")[:1]
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs]).annotate(prev=Subquery(earlier)).values_list("id", "prev")
    return {pk: prev for pk, prev in rows if prev is not None}
