"""Agent worker: the Celery tasks of the agent, the only bridge between portal and runtime.

``app`` (Celery app, queue ``hw.<slug>``) · ``tasks`` (``run_job_task``: is the delivery current?) · ``runs``
(what it runs, on one plumbing: claim, the job's pipeline or a node's ranks, report) · ``job_context`` (the
stage context of a job spec) · ``spool`` (durable, ordered, idempotent event delivery) · ``outbox`` (durable
results) · ``client`` (the portal's REST API) · ``heartbeat`` · ``agent_state`` (who this agent is, from
``DAY0_AGENT_*``) · ``commands`` (``day0 agent``, ``day0 jobs``, also ``python -m agents.worker``) · ``demo``
(helpers for ``day0 demo`` and the end-to-end benchmark). Nothing here touches the database."""
