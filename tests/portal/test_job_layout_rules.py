"""A job's pinned TP/PP/EP is checked against the planner's deployment rules: a 400 naming the rule."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("layout", "field", "rule"), [
    ({"tp": 3}, "tp", "must divide the 32 attention heads"),
    ({"tp": 16}, "tp", "must stay inside a node"),
    ({"tp": 4, "pp": 2}, "pp", "spans nodes"),
    ({"ep": 2}, "ep", "needs routed experts"),
])
def test_a_layout_no_rule_allows_is_a_400_naming_the_rule(api_client, layout, field, rule) -> None:
    org = OrganizationFactory()
    model, hardware, token = ModelReleaseFactory(organization=org), HardwareFactory(), make_token(organization=org)
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, **layout},
                               format="json", **auth(token))
    assert response.status_code == 400, response.content
    assert rule in str(response.json()[field])
    assert Job.objects.count() == 0


def test_a_deployable_layout_is_accepted(api_client) -> None:
    org = OrganizationFactory()
    model, hardware, token = ModelReleaseFactory(organization=org), HardwareFactory(), make_token(organization=org)
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, "tp": 8, "pp": 2},
                               format="json", **auth(token))
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(("bench", "key"), [({"comm_max_bytes": 4}, "comm_max_bytes"),
                                            ({"comm_timeout_s": 0}, "comm_timeout_s"),
                                            ({"comm_ranks": 1000}, "comm_ranks")])
def test_comm_sweep_options_out_of_bounds_are_a_400_naming_them(api_client, bench, key) -> None:
    org = OrganizationFactory()
    model, hardware, token = ModelReleaseFactory(organization=org), HardwareFactory(), make_token(organization=org)
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, "bench": bench},
                               format="json", **auth(token))
    assert response.status_code == 400 and key in str(response.json()), response.content
    assert Job.objects.count() == 0
