"""OpenAPI post-processing of the whole portal API (drf-spectacular hook, named in settings): a one-line summary
on every operation, and enums where a field takes one of a fixed set (stages, dtypes, threshold keys, metrics) though its serializer validates it by
hand. One table here instead of a decorator on each view; a new operation without a summary gets one built from
its method and path, and ``tests/portal`` checks none is missing."""

from __future__ import annotations

from typing import Any

SUMMARIES: dict[str, str] = {
    "agents_list": "List agents (the fleet)", "agents_create": "Register an agent (agent token)",
    "agents_retrieve": "Get an agent", "agents_heartbeat_create": "Send an agent's heartbeat",
    "benchmarks_retrieve": "Benchmark time series (JSON or CSV)",
    "benchmarks_regressions_retrieve": "Runs flagged as regressions, newest first",
    "cells_retrieve": "A cell's evidence (plan, checklist, alignment, benchmarks, jobs)",
    "hardware_list": "List hardware", "hardware_create": "Add a hardware pool", "hardware_retrieve": "Get a hardware",
    "hardware_update": "Replace a hardware", "hardware_partial_update": "Update a hardware",
    "invitations_list": "List my invitations", "invitations_retrieve": "Get an invitation",
    "invitations_accept_create": "Accept an invitation", "invitations_decline_create": "Decline an invitation",
    "jobs_list": "List jobs", "jobs_create": "Submit an adaptation job", "jobs_retrieve": "Get a job",
    "jobs_cancel_create": "Cancel a job", "jobs_events_retrieve": "A job's events after a seq",
    "jobs_events_create": "Post a batch of events (agent)", "jobs_results_create": "Post a stage's result (agent)",
    "jobs_state_create": "Report a job's state (agent)", "matrix_retrieve": "The whole compatibility matrix",
    "models_list": "List model releases", "models_create": "Add a model release", "models_retrieve": "Get a model",
    "models_update": "Replace a model", "models_partial_update": "Update a model",
    "organizations_list": "List organizations", "organizations_retrieve": "Get an organization",
    "organizations_invitations_list": "List an organization's invitations",
    "organizations_invitations_create": "Invite someone to an organization",
    "organizations_members_list": "List an organization's members",
    "organizations_members_create": "Add a member to an organization",
    "tokens_list": "List my API tokens", "tokens_create": "Create an API token", "tokens_revoke_create": "Revoke a token",
}
VERBS = {"get": "Get", "post": "Create", "put": "Replace", "patch": "Update", "delete": "Delete"}


def _enums() -> dict[str, list[str]]:
    from apps.benchmarks.regressions import known_metrics
    from apps.catalog.choices import DTYPE_NAMES
    from contract.thresholds import TABLE
    from contract.tiers import STAGE_ORDER

    return {"stages": list(STAGE_ORDER), "dtype": sorted(DTYPE_NAMES), "thresholds": list(TABLE),
            "metric": known_metrics(), "threshold_docs": [TABLE[k].doc for k in TABLE]}


def _enum_properties(schema: dict[str, Any], enums: dict[str, list[str]]) -> None:
    props = schema.get("properties") or {}
    if "stages" in props and props["stages"].get("type") == "array":
        props["stages"]["items"]["enum"] = enums["stages"]
    if "dtype" in props and props["dtype"].get("type") == "string" and "enum" not in props["dtype"]:
        props["dtype"]["enum"] = enums["dtype"]
    if "thresholds" in props and props["thresholds"].get("type") == "object":  # the keys a job may override
        props["thresholds"] = {"type": "object", "additionalProperties": False, "description": "overrides of the "
                               "versioned defaults (contract/thresholds.py); a value out of range is a 400",
                               "properties": {key: {"type": "number", "description": doc} for key, doc in
                                              zip(enums["thresholds"], enums["threshold_docs"], strict=True)}}


def add_summaries_and_enums(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """The hook: ``summary`` on each operation; enums on stage, dtype, threshold-key and metric fields."""
    enums = _enums()
    for path, operations in (result.get("paths") or {}).items():
        for method, op in operations.items():
            if not isinstance(op, dict) or method not in VERBS:
                continue
            if not op.get("summary"):
                op["summary"] = SUMMARIES.get(op.get("operationId", ""), f"{VERBS[method]} {path}")
            for param in op.get("parameters") or []:
                if param.get("name") == "metric" and param.get("in") == "query":
                    param["schema"] = {"type": "string", "enum": enums["metric"]}
                    param["explode"] = False
                    param["description"] = (param.get("description") or "") + " (comma-separated for several)"
    for schema in (result.get("components", {}).get("schemas") or {}).values():
        if isinstance(schema, dict):
            _enum_properties(schema, enums)
    return result
