"""The API root lists every resource (viewsets and plain views), and the OpenAPI schema gives every operation a
summary and fixed sets as enums."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_api_root_lists_every_resource_including_plain_views(client):
    data = client.get("/api/v1/", HTTP_ACCEPT="application/json").json()
    for name in ("models", "hardware", "jobs", "agents", "tokens", "matrix", "benchmarks", "benchmarks/regressions",
                 "cells", "schema", "docs"):
        assert name in data, name
    assert data["matrix"].endswith("/api/v1/matrix/") and data["cells"].endswith("/api/v1/cells/{model}/{hardware}/")
    assert client.get(data["matrix"].replace("http://testserver", "")).status_code == 200


def test_every_operation_has_a_summary_and_fixed_sets_are_enums(client):
    schema = client.get("/api/schema/?format=json").json()
    operations = [(path, verb, op) for path, ops in schema["paths"].items() for verb, op in ops.items()]
    assert len(operations) > 30
    missing = [(verb, path) for path, verb, op in operations if not op.get("summary")]
    assert missing == []
    create = schema["components"]["schemas"]["JobCreateRequest"]["properties"]
    assert create["stages"]["items"]["enum"][:3] == ["plan", "load", "inventory"]
    assert "float8_e4m3fn" in create["dtype"]["enum"] and "bfloat16" in create["dtype"]["enum"]
    assert "op_cosine" in create["thresholds"]["properties"] and create["thresholds"]["additionalProperties"] is False
    metric = next(p for p in schema["paths"]["/api/v1/benchmarks/"]["get"]["parameters"] if p["name"] == "metric")
    assert "ttft_ms_p50" in metric["schema"]["enum"]
    state = next(p for p in schema["paths"]["/api/v1/jobs/"]["get"]["parameters"] if p["name"] == "state")
    assert "succeeded" in state["schema"]["enum"]


def test_the_schema_validates():
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--file", "/dev/null")
