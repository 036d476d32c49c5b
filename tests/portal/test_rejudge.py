"""Verdicts are judged again when the facts they were judged with change (the hardware's spec, the model's
config or manifest) or the versioned defaults move; tiers follow and the cell's history says why. Through the
REST API with a real agent token and the owners' own tokens."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from apps.accounts.choices import Role
from apps.evidence.models import StageResult
from apps.evidence.rejudge import outdated_defaults_count
from apps.matrix.models import Cell
from contract.thresholds import DEFAULTS_VERSION
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token
from tests.portal.reports import PASSING, bound, passing

pytestmark = pytest.mark.django_db

GIB = 1 << 30


@pytest.fixture
def owned() -> dict[str, Any]:
    """A one-device, 1 GiB accelerator of its own organization (the ~2.2 GB test model does not fit on it)."""
    org = OrganizationFactory()
    hardware = HardwareFactory(organization=org, memory_bytes=GIB, devices_per_node=1)
    model = ModelReleaseFactory(organization=org)
    return {"org": org, "hardware": hardware, "model": model, "admin": make_token(organization=org, role=Role.ADMIN),
            "agent": make_token(organization=org, scopes=["agent"], hardware=hardware, role=Role.ADMIN)}


def _post(api_client: Any, w: dict[str, Any], stages: list[str]) -> Any:
    job = JobFactory(model=w["model"], hardware=w["hardware"], spec={"stages": stages, "dtype": "bfloat16"})
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/",
                               bound(job, {"stages": {s: passing(s) for s in stages}}), format="json",
                               **auth(w["agent"]))
    assert response.status_code == 201, response.content
    return response.json()


def _detail(api_client: Any, w: dict[str, Any]) -> dict[str, Any]:
    return api_client.get(f"/api/v1/cells/{w['model'].slug}/{w['hardware'].slug}/", **auth(w["admin"])).json()


def test_a_plan_posted_while_the_memory_was_inflated_is_judged_again_when_it_goes_back(api_client, owned) -> None:
    w = owned
    url = f"/api/v1/hardware/{w['hardware'].slug}/"
    assert _post(api_client, w, ["plan"])["stored"][0]["verdict"] == "fail"  # honest memory: it does not fit
    assert api_client.patch(url, {"memory_bytes": 2**50}, format="json", **auth(w["admin"])).status_code == 200
    detail = _detail(api_client, w)  # the earlier plan is judged again with the new memory too
    assert detail["tier"] == 1 and detail["history"][0]["kind"] == "rejudge"
    body = _post(api_client, w, ["plan"])
    assert body["stored"][0]["verdict"] == "pass" and body["cell"]["tier"] == 1
    back = api_client.patch(url, {"memory_bytes": GIB}, format="json", **auth(w["admin"]))
    assert back.status_code == 200, back.content
    detail = _detail(api_client, w)
    assert detail["tier"] == 0 and detail["tier_reached_at"] == {}  # the drop clears the reached time
    assert detail["verdicts"]["plan"]["status"] == "fail"
    entry = detail["history"][0]
    assert (entry["kind"], entry["tier_before"], entry["tier_after"]) == ("rejudge", 1, 0)
    assert f"hardware {w['hardware'].slug} memory_bytes changed" in entry["reason"]
    assert entry["data"]["verdicts"] == {"plan": ["pass", "fail"]}
    page = api_client.get(f"/cells/{w['model'].slug}/{w['hardware'].slug}/", **auth(w["admin"])).content.decode()
    history = page.split('id="cell-history"')[1].split("</section>")[0]
    assert f"T1 → T0: re-judged: hardware {w['hardware'].slug} memory_bytes changed (plan pass → fail)" in history
    assert StageResult.objects.get(job__hardware=w["hardware"], job__model=w["model"], verdict="fail",
                                   job_id=body["job"]).judged_at is not None


def test_a_new_manifest_judges_the_loads_again(api_client, owned) -> None:
    w = owned
    w["hardware"].memory_bytes = 80 * 10**9  # plans fit here
    w["hardware"].save()
    assert _post(api_client, w, ["plan", "load"])["cell"]["tier"] == 2
    manifest = [{"name": s["file"], "size": None, "sha256": s["sha256"]} for s in PASSING["load"]["shards"]]
    manifest[1]["sha256"] = "c" * 64
    patched = api_client.patch(f"/api/v1/models/{w['model'].slug}/", {"manifest": manifest}, format="json",
                               **auth(w["admin"]))
    assert patched.status_code == 200, patched.content
    detail = _detail(api_client, w)
    assert detail["tier"] == 1 and set(detail["tier_reached_at"]) == {"planned"}
    entry = detail["history"][0]
    assert f"model {w['model'].slug} manifest" in entry["reason"] and entry["data"]["verdicts"]["load"] == ["pass",
                                                                                                           "fail"]
    assert any("differs from the manifest" in r for r in detail["verdicts"]["load"]["reasons"])


def test_results_judged_under_older_defaults_are_judged_again_by_the_command(api_client, owned) -> None:
    w = owned
    w["hardware"].memory_bytes = 80 * 10**9
    w["hardware"].save()
    _post(api_client, w, ["plan", "load"])
    # as if judged (and refused) under an older table
    StageResult.objects.update(defaults_version="2026.11.9", verdict="fail", passed=False, reasons=["old rule"])
    call_command("rejudge_results", stdout=StringIO())  # what a deploy runs; seed runs it too
    cell = Cell.objects.get(model=w["model"], hardware=w["hardware"])
    assert outdated_defaults_count() == 0 and cell.tier == 2
    entry = cell.history.order_by("-at", "-id").first()
    assert entry.reason.startswith(f"re-judged: defaults 2026.11.9 → {DEFAULTS_VERSION}")
    assert entry.data["verdicts"] == {"load": ["fail", "pass"], "plan": ["fail", "pass"]}
    assert set(StageResult.objects.values_list("defaults_version", flat=True)) == {DEFAULTS_VERSION}


def test_an_edit_that_changes_no_judged_fact_judges_nothing(api_client, owned) -> None:
    w = owned
    _post(api_client, w, ["plan"])
    before = list(Cell.objects.get(model=w["model"], hardware=w["hardware"]).history.values_list("id", flat=True))
    url = f"/api/v1/hardware/{w['hardware'].slug}/"
    assert api_client.patch(url, {"notes": "rack 7"}, format="json", **auth(w["admin"])).status_code == 200
    assert api_client.patch(url, {"memory_bytes": GIB}, format="json", **auth(w["admin"])).status_code == 200
    assert StageResult.objects.get().judged_at is None
    assert list(Cell.objects.get(model=w["model"], hardware=w["hardware"]).history.values_list("id", flat=True)) == before
