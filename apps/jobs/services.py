"""A job's lifecycle: the one creation check the API and the browser form share, creation, the state machine
(the agents' claims and finishes included), cancellation and dispatch. The event log is ``eventlog``, lost-job
recovery ``recovery``, result ingest ``results``."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.accounts.access import Actor
from apps.accounts.choices import Scope
from apps.catalog.engines import spec_engine
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import model_is_public
from apps.core import events
from apps.core.errors import ConflictError
from apps.jobs import dispatch, placement
from apps.jobs.choices import ACTIVE_STATES, ALLOWED_TRANSITIONS, FINISHED_STATES, EventLevel, JobPurpose, JobState
from apps.jobs.eventlog import do_append_job_event
from apps.jobs.events import JobStateMessage, broadcast_job_state
from apps.jobs.models import ACTIVE_NODE_STATES, Job, JobNode, NodeState
from contract.events import failed_stage_problem
from contract.planner.search import config_layout_error
from contract.queues import hardware_queue
from contract.thresholds import check_thresholds
from contract.tiers import DEFAULT_STAGES, STAGE_ORDER

logger = logging.getLogger(__name__)


class InvalidTransition(ConflictError):
    """A state change the job's state machine does not allow; the message names both states."""


# --- creation and state -------------------------------------------------------------------------------------


def check_hardware_runs_model(model: ModelRelease, hardware: Hardware) -> None:
    """Where an embargoed model may run: on hardware its own organization owns, or on a shared catalog entry
    (no owner), whose agent tokens only staff mint. Its job's queue hands the model's config to the
    hardware's agents, so any other organization's hardware is refused (``ValidationError`` on ``hardware``,
    a 400 naming both). A public or released model runs anywhere."""
    if model_is_public(model) or hardware.organization_id is None or hardware.organization_id == model.organization_id:
        return
    owner = hardware.organization.slug if hardware.organization else hardware.organization_id
    raise ValidationError({"hardware": (
        f"{model.slug} is embargoed: it runs only on hardware {model.organization.slug} owns or on shared hardware "
        f"operated by staff, and {hardware.slug} belongs to {owner}")})


def check_may_queue_on_hardware(actor: Actor, hardware: Hardware) -> None:
    """Who queues jobs on a hardware: a shared catalog entry (no owner) takes jobs from everyone who may submit;
    an organization's hardware only from its own members with the submit scope there (a token of that
    organization), and from staff sessions. ``PermissionDenied`` (403) naming the hardware and its owner."""
    owner_id = hardware.organization_id
    if owner_id is None or (actor.is_staff and actor.token is None) or actor.has_scope(Scope.SUBMIT, owner_id):
        return
    owner = hardware.organization.slug if hardware.organization else owner_id
    raise PermissionDenied(f"hardware {hardware.slug} belongs to {owner}: only its members (submitters or admins, "
                           f"with a session or a {owner} token) queue jobs on it")


def default_dtype(hardware: Hardware) -> str:
    """The dtype of a job that names none: bfloat16 where the hardware runs it (or lists no dtypes), else
    float32."""
    return "bfloat16" if "bfloat16" in hardware.dtypes or not hardware.dtypes else "float32"


def check_job_spec(model: ModelRelease, hardware: Hardware, spec: dict[str, Any]) -> dict[str, Any]:
    """What a job's spec must meet on this model and hardware, beyond the ranges of the request itself
    (``api.serializers.JobCreateSerializer``): lengths in its thresholds within the model's context, a dtype the
    hardware runs (``default_dtype`` when none is named), and a pinned TP/PP/EP some deployment rule of the
    planner allows. A ``ValidationError`` names the field; returns the spec with its dtype filled in."""
    try:
        check_thresholds(spec.get("thresholds") or {}, context_length=model.context_length)
    except ValueError as exc:
        raise ValidationError({"thresholds": str(exc)}) from None
    named = spec.get("dtype")
    if named and hardware.dtypes and named not in hardware.dtypes:
        raise ValidationError({"dtype": f"{hardware.slug} does not support {named} "
                                        f"(it supports {', '.join(hardware.dtypes)})"})
    spec = {**spec, "dtype": named or default_dtype(hardware)}
    engine = spec_engine(spec.pop("engine", None), spec.pop("engine_command", None))  # 400 naming it
    if engine is not None:
        spec["engine"] = engine
    layout = config_layout_error(model.config, hardware, spec.get("tp"), spec.get("pp"), spec.get("ep"))
    if layout is not None:
        raise ValidationError({layout.field: str(layout)})
    return spec


def check_create_job(actor: Actor, *, model: ModelRelease, hardware: Hardware, spec: dict[str, Any]) -> Job:
    """The one creation check of the REST API and the browser form: the spec on this model and hardware
    (``check_job_spec``, 400 naming the field); then submitters (of the model's organization for a private model)
    create jobs, an embargoed model only on hardware ``check_hardware_runs_model`` allows."""
    spec = check_job_spec(model, hardware, spec)
    org_id = actor.default_org_id()
    if not model_is_public(model):
        org_id = model.organization_id
    if not actor.has_scope(Scope.SUBMIT, org_id):
        raise PermissionDenied("creating a job needs the submit scope (a submitter or admin role)")
    check_hardware_runs_model(model, hardware)  # the embargo's 400 first: it names the model's rule
    check_may_queue_on_hardware(actor, hardware)
    return do_create_job(model=model, hardware=hardware, spec=spec, organization_id=org_id,
                         requested_by_id=actor.user_id)


@transaction.atomic
def do_create_job(*, model: ModelRelease, hardware: Hardware, spec: dict[str, Any],
                  organization_id: int | None = None, requested_by_id: int | None = None,
                  purpose: str = JobPurpose.CERTIFY) -> Job:
    """Stores a queued job and hands it to ``do_dispatch_job`` once the transaction commits. ``nodes``: the
    hosts its plan spans (``placement.plan_nodes``), one agent each."""
    job = Job.objects.create(model=model, hardware=hardware, spec=spec, organization_id=organization_id,
                             requested_by_id=requested_by_id, state=JobState.QUEUED, purpose=purpose,
                             nodes=placement.plan_nodes(model, hardware, spec))
    events.send_now(events.cell_inputs_changed, model_id=model.pk, hardware_id=hardware.pk, reason="", history=None)
    job_id = job.pk
    transaction.on_commit(lambda: do_dispatch_job(job_id))
    return job


def _state_message(job: Job) -> JobStateMessage:
    return JobStateMessage(type="job.state", job=job.pk, state=job.state, attempts=job.attempts,
                           failed_stage=job.failed_stage, error=job.error)


@transaction.atomic
def do_transition_job(job: Job, to_state: str, *, failed_stage: str | None = None, error: str | None = None,
                      agent_id: int | None = None) -> Job:
    """Moves ``job`` to ``to_state`` if the state machine allows it (``choices.ALLOWED_TRANSITIONS``).

    Sets the timestamps, counts an attempt on each dispatch, stores failed stage and error, recomputes the
    cell when the job finishes and broadcasts the new state after commit. Raises ``InvalidTransition``."""
    if to_state not in JobState.values:
        raise InvalidTransition(f"unknown job state {to_state!r}; states are {', '.join(JobState.values)}")
    locked = Job.objects.select_for_update().get(pk=job.pk)
    if to_state not in ALLOWED_TRANSITIONS[locked.state]:
        raise InvalidTransition(f"job {job.pk} cannot go from {locked.state} to {to_state}")
    now = timezone.now()
    locked.state = to_state
    if agent_id is not None:
        locked.agent_id = agent_id
    if to_state == JobState.DISPATCHED:
        locked.attempts += 1
        locked.nonce = secrets.token_hex(16)
        locked.dispatched_at = now
    elif to_state == JobState.RUNNING:
        if locked.dispatched_at is None:
            locked.attempts += 1
            locked.nonce = secrets.token_hex(16)
            locked.dispatched_at = now
        locked.started_at = locked.started_at or now
    elif to_state == JobState.QUEUED:
        locked.finished_at = None
        locked.failed_stage, locked.error = "", ""
    if to_state in FINISHED_STATES:
        locked.finished_at = now
    if failed_stage is not None:
        locked.failed_stage = failed_stage[:32]
    if error is not None:
        locked.error = error
    locked.save()
    for name in ("state", "attempts", "nonce", "agent_id", "dispatched_at", "started_at", "finished_at",
                 "failed_stage", "error", "updated_at"):
        setattr(job, name, getattr(locked, name))
    if to_state in FINISHED_STATES or to_state == JobState.QUEUED:
        placement.release_nodes(locked.pk)  # its agents are free for the next job (or the next attempt)
        events.send_now(events.cell_inputs_changed, model_id=locked.model_id, hardware_id=locked.hardware_id,
                        reason=f"job {locked.pk} {to_state}" + (f" at {locked.failed_stage}" if locked.failed_stage
                                                                else ""), history=None)
    message = _state_message(locked)
    transaction.on_commit(lambda: broadcast_job_state(message))
    if to_state in (JobState.FAILED, JobState.LOST):
        events.publish(events.job_failed, job_id=locked.pk, model_id=locked.model_id, hardware_id=locked.hardware_id,
                       state=str(to_state), failed_stage=locked.failed_stage, error=locked.error,
                       attempts=locked.attempts)
    return job


def may_cancel_job(actor: Actor, job: Job) -> bool:
    """Whether ``actor`` may cancel ``job`` whatever its state: its requester, staff, or a submitter of the job's
    organization (a job without one is cancelled only by its requester or staff). Through a token, only one
    with the submit scope: a read token never writes."""
    if actor.user_id is None or (actor.token is not None and not actor.token.has_scope(Scope.SUBMIT)):
        return False
    in_org = job.organization_id is not None and actor.has_scope(Scope.SUBMIT, job.organization_id)
    return actor.user_id == job.requested_by_id or actor.is_staff or in_org


def can_cancel_job(actor: Actor, job: Job) -> bool:
    """Whether ``check_cancel_job`` would cancel ``job`` now (pages show the cancel button from this)."""
    return job.state in ACTIVE_STATES and may_cancel_job(actor, job)


def check_cancel_job(actor: Actor, job: Job) -> Job:
    """The requester, or a submitter of the job's organization, cancels a queued, dispatched or running job."""
    if not may_cancel_job(actor, job):
        raise PermissionDenied("cancelling this job needs the submit scope in its organization")
    if job.state not in ACTIVE_STATES:
        raise InvalidTransition(f"job {job.pk} is {job.state}; only queued, dispatched or running jobs can be cancelled")
    return do_transition_job(job, JobState.CANCELLED, error="cancelled by user")


def check_agent_for_job(actor: Actor, job: Job, *, reporting: bool = False) -> None:
    """Agents act only on jobs of the hardware their token is bound to, and once an agent claimed a job, only
    through that agent's token: another agent of the same hardware cannot write into its log or evidence.
    ``reporting`` (events, results): a queued or dispatched job is claimed first (409), so no agent reports on a
    job before it is its own."""
    if not actor.has_scope(Scope.AGENT):
        raise PermissionDenied("this needs an agent token")
    if actor.hardware_id != job.hardware_id:
        raise PermissionDenied(f"the agent token is bound to another hardware than job {job.pk}'s")
    if reporting and job.state in (JobState.QUEUED, JobState.DISPATCHED):
        raise InvalidTransition(f"job {job.pk} is {job.state}: an agent claims it (state running) before it "
                                "reports events or results")
    if job.agent_id is not None:
        owner_token = Job.objects.filter(pk=job.pk).values_list("agent__token_id", flat=True).first()
        if owner_token != actor.token.pk:
            raise PermissionDenied(f"job {job.pk} is run by agent {job.agent_id}, registered with another token")


def check_event_log_open(job: Job) -> None:
    """A job's agent flushes its events before it reports the job succeeded or failed, so the log of a job in
    either state is closed (409). A cancelled or lost job's is not: the portal ended it while its agent ran, and
    the agent's last lines still arrive."""
    if job.state in (JobState.SUCCEEDED, JobState.FAILED):
        raise InvalidTransition(f"job {job.pk} is {job.state}: its event log is closed (an agent posts its events "
                                "before it reports the job's final state)")


AGENT_STATES = (JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED)


def _agent_of_token(actor: Actor, agent_id: int | None) -> Any:
    """The agent ``agent_id`` registered with the actor's token (the token's agents, read through its relation:
    the fleet app sits above jobs)."""
    if agent_id is None:
        return None
    agent = actor.token.agent_set.filter(pk=agent_id).first()
    if agent is None:
        raise PermissionDenied(f"agent {agent_id} is not registered with this token")
    return agent


def check_agent_transition_job(actor: Actor, job: Job, to_state: str, *, agent_id: int | None = None,
                               attempt: int | None = None, failed_stage: str | None = None,
                               error: str | None = None) -> Job:
    """An agent claims a dispatched job (dispatched → running, naming its agent id, which must be registered
    with its token, and optionally the attempt its delivery carries) and finishes the job it claimed (running →
    succeeded | failed). Every other move is the portal's: queued, dispatched and lost are refused with a 400,
    a claim of a job that is not dispatched (or of a stale attempt) or a finish of one that is not running is a
    409, and a finish from another agent than the claimant is a 403."""
    check_agent_for_job(actor, job)
    if to_state not in AGENT_STATES:
        raise ValidationError({"state": f"an agent reports only {', '.join(AGENT_STATES)}, not {to_state!r}"})
    agent = _agent_of_token(actor, agent_id)
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        check_agent_for_job(actor, locked)  # again on the locked row: it may have been lost and re-queued meanwhile
        if failed_stage and to_state != JobState.FAILED:
            raise ValidationError({"failed_stage": f"a {to_state} report names no failed stage (a failed one does), "
                                                   f"got {failed_stage!r}"})
        if failed_stage and (problem := failed_stage_problem(failed_stage, locked.stages)) is not None:
            raise ValidationError({"failed_stage": problem})
        if to_state == JobState.RUNNING:
            if locked.state != JobState.DISPATCHED:
                raise InvalidTransition(f"job {job.pk} is {locked.state}; an agent claims only a dispatched job")
            if agent is None:
                raise ValidationError({"agent": "a claim names the agent that runs the job (its id from registering)"})
            if attempt is not None and attempt != locked.attempts:
                raise InvalidTransition(f"the claim is for attempt {attempt}, job {job.pk} is at attempt "
                                        f"{locked.attempts}: a stale delivery")
            if locked.nodes > 1:  # a multi-node job is claimed by the agent reserved as its node 0
                claimed = JobNode.objects.filter(job=locked, attempt=locked.attempts, rank=0, agent=agent,
                                                 state=NodeState.RESERVED).update(state=NodeState.RUNNING,
                                                                                  claimed_at=timezone.now())
                if not claimed:
                    raise InvalidTransition(f"job {job.pk} runs on {locked.nodes} nodes: agent {agent.pk} is not "
                                            f"its node 0 for attempt {locked.attempts}")
            else:  # an agent reserved for a multi-node job runs that one next: it leaves this job to another
                held = JobNode.objects.filter(agent=agent, state__in=ACTIVE_NODE_STATES).first()
                if held is not None:
                    raise InvalidTransition(f"agent {agent.pk} is reserved for node {held.rank} of job "
                                            f"{held.job_id}; job {job.pk} is left to another agent")
        else:
            if locked.state != JobState.RUNNING:
                raise InvalidTransition(f"job {job.pk} is {locked.state}; an agent finishes only a running job")
            if agent is not None and locked.agent_id is not None and agent.pk != locked.agent_id:
                raise PermissionDenied(f"job {job.pk} is run by agent {locked.agent_id}, not {agent.pk}")
            if to_state == JobState.SUCCEEDED:
                missing = stages_without_result(locked)
                if missing:  # a job succeeds only when every stage it asked for has a verdict
                    to_state, failed_stage = JobState.FAILED, missing[0]
                    error = f"no result for stages: {', '.join(missing)}"
        do_transition_job(locked, to_state, failed_stage=failed_stage, error=error,
                          agent_id=agent.pk if to_state == JobState.RUNNING else None)
    for name in ("state", "attempts", "agent_id", "dispatched_at", "started_at", "finished_at", "failed_stage",
                 "error", "updated_at"):
        setattr(job, name, getattr(locked, name))
    return job


def stages_without_result(job: Job) -> list[str]:
    """The stages ``job`` asked for that have no stored verdict from its current attempt, in the pipeline's order
    (``STAGE_ORDER``); the results are read through the job's ``stage_results`` relation (evidence sits above
    jobs)."""
    requested = job.stages or list(DEFAULT_STAGES)
    have = set(job.stage_results.filter(attempt=job.attempts).values_list("stage", flat=True))
    return [s for s in STAGE_ORDER if s in requested and s not in have]


# --- dispatch -----------------------------------------------------------------------------------------------


def do_dispatch_job(job_id: int) -> None:
    """Sends queued job ``job_id`` to its hardware's agents as one more attempt (a job no longer queued is left
    alone). A job that used up ``DAY0_JOB_MAX_ATTEMPTS`` fails instead, naming the cap. When the broker refuses
    the message, the job goes back to queued with the reason and the attempt is not counted (no agent got it);
    ``recovery.do_requeue_lost_jobs`` sends it again later."""
    cap = dispatch.max_attempts()
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("model", "hardware").filter(pk=job_id).first()
        if job is None or job.state != JobState.QUEUED:
            return
        if job.attempts >= cap:
            do_transition_job(job, JobState.FAILED, error=f"gave up after {job.attempts} attempts "
                                                           f"(DAY0_JOB_MAX_ATTEMPTS={cap})")
            return
        nodes: list[JobNode] = []
        missing = placement.engine_waiting_reason(job)
        if missing is not None:  # no online agent of its hardware can start the engine it names
            _note_waiting(job, missing)
            return
        if job.nodes > 1:  # all of its agents at once, or none
            nodes, waiting = placement.reserve_nodes(job, job.attempts + 1)
            if waiting is not None:
                _note_waiting(job, waiting)
                return
        do_transition_job(job, JobState.DISPATCHED)
        events.send_now(events.job_dispatched, job=job)  # e.g. this attempt's secret challenge (references)
    try:
        if nodes:
            dispatch.send_job(job, nodes)
        else:
            dispatch.send_job(job)
    except Exception as exc:  # the broker is down: the job stays visible as queued, with the reason
        logger.exception("job %s: sending to %s failed", job_id, hardware_queue(job.hardware.slug))
        with transaction.atomic():
            locked = Job.objects.select_for_update().filter(pk=job_id, state=JobState.DISPATCHED,
                                                            attempts=job.attempts, agent__isnull=True).first()
            if locked is None:
                return  # an agent claimed it meanwhile (the broker did take it) or it was cancelled
            do_transition_job(locked, JobState.QUEUED)  # releases its reserved nodes: none runs
            Job.objects.filter(pk=job_id).update(
                attempts=F("attempts") - 1, dispatched_at=None,
                error=f"dispatch failed, will retry: {type(exc).__name__}: {exc}")


def _note_waiting(job: Job, reason: str) -> None:
    """A multi-node job stays queued until enough agents are free, a job naming an engine until an online agent
    of its hardware has it: the reason is its error (the API and page
    show it) and, when it changes, an event; ``recovery.do_requeue_lost_jobs`` tries the dispatch again later."""
    if job.error == reason:
        Job.objects.filter(pk=job.pk).update(updated_at=timezone.now())
        return
    Job.objects.filter(pk=job.pk).update(error=reason, updated_at=timezone.now())
    job.error = reason
    do_append_job_event(job.pk, kind="waiting", level=EventLevel.WARNING, message=reason,
                        data={"nodes": job.nodes, "attempt": job.attempts + 1,
                              **({"engine": job.spec["engine"].get("name")} if job.spec.get("engine") else {})})

