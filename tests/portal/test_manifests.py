"""Manifests come from the publisher, staff or the reference run, never from a vendor's load: through the REST
API with real agent tokens, a vendor's bogus digests neither become the manifest nor fail another vendor's
load, a disagreement between hardware shows until staff settle it, and only staff replace a manifest."""

from __future__ import annotations

import re
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.catalog.models import ModelRelease
from apps.evidence.models import StageResult
from apps.jobs.choices import JobPurpose, JobState
from apps.jobs.dispatch import task_payload
from apps.jobs.services import do_transition_job
from contract.manifest import check_manifest
from tests.factories import (
    HardwareFactory,
    JobFactory,
    ModelReleaseFactory,
    OrganizationFactory,
    UserFactory,
    auth,
    make_token,
)
from tests.portal.reports import passing

pytestmark = pytest.mark.django_db

A, B = "a" * 64, "b" * 64
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def vendor() -> tuple[Any, Any]:
    hardware = HardwareFactory()
    return hardware, make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)


def staff_client() -> APIClient:
    """Staff act through a session: a token never acts as staff."""
    client = APIClient()
    client.force_login(UserFactory(is_staff=True))
    return client


def dispatched(model: ModelRelease, hardware: Any, purpose: str = JobPurpose.CERTIFY) -> tuple[Any, dict]:
    """A job sent to its agent (a new attempt and nonce) and claimed, with the payload its agent received."""
    job = JobFactory(model=model, hardware=hardware, state=JobState.QUEUED, purpose=purpose,
                     spec={"stages": ["plan", "load"], "dtype": "float32"})
    do_transition_job(job, JobState.DISPATCHED)
    payload = task_payload(job)
    do_transition_job(job, JobState.RUNNING)
    return job, payload


def load_section(*digests: str, **extra: Any) -> dict[str, Any]:
    section = passing("load")
    for shard, digest in zip(section["shards"], digests, strict=False):
        shard["sha256"] = digest
    section.update(extra)
    return section


def post_load(api_client: Any, job: Any, token: Any, section: dict[str, Any]) -> dict[str, Any]:
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", {"stage": "load", "section": section,
                                                                   "attempt": job.attempts, "nonce": job.nonce},
                               format="json", **auth(token))
    assert response.status_code == 201, response.content
    return response.json()


def test_a_vendors_bogus_digests_neither_become_the_manifest_nor_fail_another_vendors_load(api_client,
                                                                                         client) -> None:
    model = ModelReleaseFactory()
    (bogus_hw, bogus), (honest_hw, honest) = vendor(), vendor()
    job, _ = dispatched(model, bogus_hw)
    body = post_load(api_client, job, bogus, load_section("d" * 64, "e" * 64))
    assert body["stored"][0]["verdict"] == "pass"
    model.refresh_from_db()
    assert model.manifest == [] and model.manifest_source == "" and model.tensor_count is None
    job, _ = dispatched(model, honest_hw)
    body = post_load(api_client, job, honest, load_section(A, B))
    assert body["stored"][0]["verdict"] == "pass" and body["stored"][0]["reasons"] == []
    notes = api_client.get(f"/api/v1/cells/{model.slug}/{honest_hw.slug}/").json()["evidence"]["stages"]["load"]
    assert "load: no publisher manifest: digests not verified" in notes["notes"], notes
    # the two hardware disagree: shown on the model API and the cell page, the manifest stays empty
    detail = api_client.get(f"/api/v1/models/{model.slug}/", **auth(honest)).json()
    conflict = detail["digest_conflict"]
    pair = dict(zip(conflict["hardware"], conflict["sha256"], strict=True))
    assert conflict["file"] == SHARDS[0] and pair == {bogus_hw.slug: "d" * 64, honest_hw.slug: A}
    assert conflict["files_differing"] == 2 and len(conflict["groups"]) == 2
    kept = {row["hardware"]: row["shards"] for row in detail["hardware_digests"]}
    assert kept == {bogus_hw.slug: dict(zip(SHARDS, ["d" * 64, "e" * 64], strict=True)),
                    honest_hw.slug: dict(zip(SHARDS, [A, B], strict=True))}
    assert detail["manifest"] == [] and detail["manifest_source"] == ""
    cell = api_client.get(f"/api/v1/cells/{model.slug}/{honest_hw.slug}/").json()
    assert cell["digest_conflict"]["file"] == SHARDS[0] and cell["manifest"]["source"] is None
    page = client.get(f"/cells/{model.slug}/{honest_hw.slug}/").content.decode()
    assert 'id="mark-digest-conflict"' in page and "until staff settle it" in page


def test_only_staff_settle_a_disagreement_and_loads_are_then_compared_with_it(api_client) -> None:
    model = ModelReleaseFactory()
    (bogus_hw, bogus), (honest_hw, honest) = vendor(), vendor()
    for hardware, token, digests in ((bogus_hw, bogus, ("d" * 64, B)), (honest_hw, honest, (A, B))):
        job, _ = dispatched(model, hardware)
        post_load(api_client, job, token, load_section(*digests))
    bogus_cell = f"/api/v1/cells/{model.slug}/{bogus_hw.slug}/"
    assert api_client.get(bogus_cell).json()["verdicts"]["load"]["status"] == "pass"
    url = f"/api/v1/models/{model.slug}/manifest/settle/"
    owner_admin = make_token(organization=model.organization, role="admin")
    for token in (bogus, honest, owner_admin):
        response = api_client.post(url, {"hardware": honest_hw.slug}, format="json", **auth(token))
        assert response.status_code == 403, response.content
    assert ModelRelease.objects.get(pk=model.pk).manifest == []
    staff = staff_client()
    for body, field in (({}, "detail"), ({"hardware": "nowhere"}, "hardware"),
                        ({"manifest": [{"name": "x", "sha256": "zz"}]}, "manifest")):
        response = staff.post(url, body, format="json")
        assert response.status_code == 400 and field in response.json(), response.content
    response = staff.post(url, {"hardware": honest_hw.slug}, format="json")
    assert response.status_code == 200, response.content
    settled = response.json()
    assert settled["manifest_source"] == "staff" and settled["digest_conflict"] == {}
    assert [(m["name"], m["sha256"]) for m in settled["manifest"]] == [(SHARDS[0], A), (SHARDS[1], B)]
    assert settled["manifest_seen"]["hardware"] == honest_hw.slug and settled["manifest_seen"]["by"]
    # the stored loads are judged again against the settled manifest: the bogus one fails, the honest one passes
    load = api_client.get(bogus_cell).json()["verdicts"]["load"]
    assert load["status"] == "fail" and any(SHARDS[0] in r and "differs from the manifest's" in r
                                            for r in load["reasons"]), load
    assert api_client.get(f"/api/v1/cells/{model.slug}/{honest_hw.slug}/").json()["verdicts"]["load"]["status"] == "pass"
    job, _ = dispatched(model, bogus_hw)
    body = post_load(api_client, job, bogus, load_section("d" * 64, B))
    assert body["stored"][0]["verdict"] == "fail"
    assert f"load: shard {SHARDS[0]} sha256 {'d' * 64} differs from the manifest's {A}" in body["stored"][0]["reasons"]


def test_the_reference_runs_load_records_the_manifest_and_no_other_load_does(api_client) -> None:
    model = ModelReleaseFactory()
    reference = HardwareFactory(reference=True)
    ref_token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=reference)
    plain_hw, plain = vendor()
    # a certify job on the reference host, and a "reference" job on other hardware, record nothing
    for hardware, token, purpose in ((plain_hw, plain, JobPurpose.REFERENCE), (reference, ref_token, JobPurpose.CERTIFY)):
        job, _ = dispatched(model, hardware, purpose)
        assert post_load(api_client, job, token, load_section("d" * 64, B))["stored"][0]["verdict"] == "pass"
        assert ModelRelease.objects.get(pk=model.pk).manifest == []
    certify_on_reference = job
    job, _ = dispatched(model, reference, JobPurpose.REFERENCE)
    post_load(api_client, job, ref_token, load_section(A, B))
    model.refresh_from_db()
    assert model.manifest_source == "reference" and model.manifest_seen["job"] == job.pk
    assert [m["sha256"] for m in model.manifest] == [A, B] and model.tensor_count == 201
    # the earlier loads are judged again against it
    assert api_client.get(f"/api/v1/cells/{model.slug}/{reference.slug}/").json()["verdicts"]["load"]["status"] == "fail"
    assert StageResult.objects.get(job=certify_on_reference, stage="load").verdict == "fail"
    job, _ = dispatched(model, plain_hw)
    body = post_load(api_client, job, plain, load_section("d" * 64, B))
    assert body["stored"][0]["verdict"] == "fail" and SHARDS[0] in body["stored"][0]["reasons"][0]


def test_the_creator_gives_a_manifest_and_only_staff_replace_it(api_client) -> None:
    model = ModelReleaseFactory()
    owner = make_token(organization=model.organization)
    manifest = [{"name": SHARDS[0], "size": None, "sha256": A}, {"name": SHARDS[1], "size": None, "sha256": B}]
    response = api_client.patch(f"/api/v1/models/{model.slug}/", {"manifest": manifest}, format="json", **auth(owner))
    assert response.status_code == 200 and response.json()["manifest_source"] == "given", response.content
    other = [{**manifest[0], "sha256": "c" * 64}, manifest[1]]
    response = api_client.patch(f"/api/v1/models/{model.slug}/", {"manifest": other}, format="json", **auth(owner))
    assert response.status_code == 403 and "only staff change it" in response.json()["detail"]
    response = api_client.patch(f"/api/v1/models/{model.slug}/", {"manifest": []}, format="json", **auth(owner))
    assert response.status_code == 403
    assert ModelRelease.objects.get(pk=model.pk).manifest[0]["sha256"] == A  # nothing lost
    response = staff_client().patch(f"/api/v1/models/{model.slug}/", {"manifest": other}, format="json")
    assert response.status_code == 200 and response.json()["manifest_source"] == "staff", response.content
    response = api_client.patch(f"/api/v1/models/{model.slug}/", {"manifest": other}, format="json", **auth(owner))
    assert response.status_code == 200 and response.json()["manifest_source"] == "staff"  # the same again
    created = api_client.post("/api/v1/models/", {"slug": "with-manifest", "name": "With", "manifest": manifest,
                                                  "config": model.config}, format="json", **auth(owner))
    assert created.status_code == 201 and created.json()["manifest_source"] == "given", created.content


def test_a_legacy_first_seen_manifest_is_shown_and_never_fails_a_load(api_client) -> None:
    model = ModelReleaseFactory(manifest=[{"name": SHARDS[0], "size": None, "sha256": "d" * 64},
                                          {"name": SHARDS[1], "size": None, "sha256": B}],
                                manifest_source="first seen (legacy)")
    hardware, token = vendor()
    job, _ = dispatched(model, hardware)
    body = post_load(api_client, job, token, load_section(A, B))
    assert body["stored"][0]["verdict"] == "pass"
    cell = api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/").json()
    notes = cell["evidence"]["stages"]["load"]["notes"]
    assert any("first seen on a vendor's load (legacy)" in n and SHARDS[0] in n for n in notes), notes
    assert cell["manifest"]["source"] == "first seen (legacy)"


def test_the_job_an_agent_reads_carries_no_manifest_digests(api_client) -> None:
    model = ModelReleaseFactory(manifest=[{"name": SHARDS[0], "size": 10, "sha256": A}], manifest_source="given")
    hardware, token = vendor()
    job, payload = dispatched(model, hardware)
    seen = api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(token)).json()
    assert seen["manifest"] is None and A not in str(seen) and A not in str(payload)
    owner = make_token(organization=model.organization)
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(owner)).json()["manifest"][0]["sha256"] == A


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_a_first_seen_manifest_and_marks_it_legacy() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("catalog", "0004_hardware_reference")], [("catalog", "0005_manifest_sources")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("catalog", "ModelRelease")
    org = OrganizationFactory()
    old.objects.create(slug="legacy-1b", name="Legacy", organization_id=org.pk, architecture="LlamaForCausalLM",
                       family="llama", params_total=1, params_active=1, context_length=2048, config={},
                       manifest=[{"name": SHARDS[0], "size": 1, "sha256": A}], manifest_source="first seen",
                       digest_conflict={"file": SHARDS[0]})
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # later migrations too: the model reads their fields
    release = ModelRelease.objects.get(slug="legacy-1b")
    assert release.manifest_source == "first seen (legacy)" and release.manifest[0]["sha256"] == A


@pytest.mark.parametrize(("name", "message"), [
    ("../model.safetensors", "[0].name must be a file name without directories"),
    ("a\x07.safetensors", "[0].name must be a file name without control characters"),
])
def test_a_manifest_name_says_what_is_wrong_with_it(name, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_manifest([{"name": name, "size": None, "sha256": A}])
