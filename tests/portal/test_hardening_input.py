"""No 5xx from bad input, portal-wide: deeply nested JSON on every JSON endpoint, lone
surrogates in text, impossible dates, unbounded job settings, and CSV filenames built from query parameters."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from apps.accounts.choices import Role
from apps.jobs import services as job_services
from apps.jobs.models import Job, JobEvent
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db

DEEP = "[" * 1000 + "]" * 1000  # 2 KB
DEEP_OBJECT = '{"a":' * 700 + "1" + "}" * 700


@pytest.fixture
def world() -> dict[str, Any]:
    org = OrganizationFactory(slug="vendor")
    hardware = HardwareFactory(organization=org, slug="hw-1")
    model = ModelReleaseFactory(organization=org, slug="model-1")
    job = JobFactory(model=model, hardware=hardware, organization=org)
    return {"org": org, "hardware": hardware, "model": model, "job": job,
            "admin": make_token(organization=org, role=Role.ADMIN),
            "agent": make_token(organization=org, scopes=["agent"], hardware=hardware)}


def _write_operations(api_client, world: dict[str, Any]) -> list[tuple[str, str]]:
    """(method, url) of every operation of /api/schema/ that takes a JSON body, path parameters filled in."""
    schema = api_client.get("/api/schema/?format=json").json()
    # the job's own id in the jobs' paths; elsewhere an id that names nothing (a token id might be the caller's)
    values = {"slug": world["model"].slug, "model": world["model"].slug, "hardware": world["hardware"].slug}
    operations = []
    for path, item in schema["paths"].items():
        for method in ("post", "put", "patch"):
            if method not in item:
                continue
            url = path
            if path.startswith("/api/v1/hardware/"):
                url = url.replace("{slug}", world["hardware"].slug)
            if path.startswith("/api/v1/organizations/"):
                url = url.replace("{slug}", world["org"].slug)
            fill = {**values, "id": str(world["job"].pk) if path.startswith("/api/v1/jobs/") else "999999"}
            url = re.sub(r"\{(\w+)\}", lambda m, fill=fill: fill.get(m.group(1), "1"), url)
            operations.append((method.upper(), url))
    assert len(operations) >= 10, operations
    return operations


@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT])
def test_deeply_nested_json_is_a_400_on_every_json_endpoint(api_client, world, body: str) -> None:
    """Every endpoint that reads the body refuses it for its depth; the others refuse the caller, or the object,
    before reading it (a 403 or 404 saying which), and cancelling takes no body at all."""
    parsed = 0
    for method, url in _write_operations(api_client, world):
        for name in ("admin", "agent"):
            response = api_client.generic(method, url, body, content_type="application/json", **auth(world[name]))
            detail = str(response.json().get("detail", "")) if response.status_code != 200 else ""
            where = (method, url, name, response.status_code, response.content[:300])
            if response.status_code == 400:
                assert "deeper than 64" in detail, where
                parsed += 1
            elif response.status_code == 403:
                assert re.search(r"needs|staff's", detail), where
            elif response.status_code == 404:
                assert re.match(r"(no \w+ with pk|No \w+ matches the given query)", detail), where
            else:
                assert (response.status_code, url, name) == (200, f"/api/v1/jobs/{world['job'].pk}/cancel/", "admin")
    assert parsed >= 20  # models, hardware, jobs, events, results, state, nodes, agents, tokens, members, …
    response = api_client.generic("POST", f"/api/v1/jobs/{world['job'].pk}/events/", body,
                                  content_type="application/json", **auth(world["agent"]))
    assert response.status_code == 400 and "deeper than 64 levels" in response.json()["detail"]


def test_nesting_within_the_limit_and_brackets_inside_strings_are_accepted(api_client, world) -> None:
    data = {"x": 1}
    for _ in range(40):
        data = {"nested": data}
    events = [{"seq": 1, "ts": "2026-01-01T00:00:00Z", "kind": "log", "message": "[" * 500 + "{" * 500,
               "data": data}]
    response = api_client.post(f"/api/v1/jobs/{world['job'].pk}/events/", events, format="json",
                               **auth(world["agent"]))
    assert response.status_code == 200, response.content
    assert JobEvent.objects.get(job=world["job"], seq=1).message.startswith("[[[")


def test_a_lone_surrogate_is_a_400_naming_the_field_and_nothing_is_stored(api_client, world) -> None:
    job = world["job"]
    body = '[{"seq": 1, "ts": "2026-01-01T00:00:00Z", "kind": "log", "message": "bad \\ud800 text"}]'
    response = api_client.generic("POST", f"/api/v1/jobs/{job.pk}/events/", body, content_type="application/json",
                                  **auth(world["agent"]))
    assert response.status_code == 400, response.content
    assert "[0].message" in response.json()["detail"] and "surrogate" in response.json()["detail"]
    assert not JobEvent.objects.filter(job=job).exists()
    body = '{"slug": "s-1", "name": "x\\udfff", "config": {}}'
    response = api_client.generic("POST", "/api/v1/models/", body, content_type="application/json",
                                  **auth(world["admin"]))
    assert response.status_code == 400 and "name" in response.json()["detail"]
    body = json.dumps({"model": "model-1", "hardware": "hw-1", "bench": {"\ud800": 1}})
    response = api_client.generic("POST", "/api/v1/jobs/", body, content_type="application/json",
                                  **auth(world["admin"]))
    assert response.status_code == 400 and "bench" in response.json()["detail"]


def test_an_escaped_surrogate_pair_is_valid_text_and_is_stored(api_client, world) -> None:
    body = '[{"seq": 1, "ts": "2026-01-01T00:00:00Z", "kind": "log", "message": "ok \\ud83d\\ude00"}]'
    response = api_client.generic("POST", f"/api/v1/jobs/{world['job'].pk}/events/", body,
                                  content_type="application/json", **auth(world["agent"]))
    assert response.status_code == 200, response.content
    assert JobEvent.objects.get(job=world["job"], seq=1).message == "ok \U0001f600"


@pytest.mark.parametrize("value", ["2025-02-30", "2025-13-01T00:00:00Z", "2025-01-01T25:00:00", "2025-02-29"])
@pytest.mark.parametrize("param", ["since", "until"])
def test_an_impossible_date_is_a_400_naming_the_parameter(api_client, world, param: str, value: str) -> None:
    for url in ("/api/v1/benchmarks/", "/api/v1/benchmarks/regressions/"):
        response = api_client.get(url, {param: value}, **auth(world["admin"]))
        assert response.status_code == 400, (url, response.content)
        assert param in response.json()
    page = api_client.get("/trends/", {"model": world["model"].slug, "hardware": world["hardware"].slug, param: value})
    assert page.status_code == 200  # the page names the problem above its (empty) charts
    alert = re.search(r'<p class="error" role="alert">([^<]*)</p>', page.content.decode())
    if param == "since":
        assert alert and alert[1].startswith("since ") and f"&#x27;{value}&#x27;" in alert[1], alert
    else:
        assert alert is None  # the page filters by since only: until is not read


@pytest.mark.parametrize(("bench", "key", "bound"), [
    ({"seed": 2**70}, "seed", "9223372036854775807"),
    ({"input_len": 10**12}, "input_len", "1048576 (2**20)"),
    ({"output_len": 0}, "output_len", "from 1"),
    ({"num_prompts": 10**9}, "num_prompts", "100000"),
    ({"num_prompts": 4.5}, "num_prompts", "integer"),
    ({"request_rate": 1e300}, "request_rate", "10000"),
    ({"concurrency": [1] * 40}, "concurrency", "32"),
    ({"concurrency": [2**40]}, "concurrency", "4096"),
    ({"comm_max_bytes": 2**70}, "comm_max_bytes", "from 8 to 17179869184 (2**34)"),
    ({"serve_args": ["--x"] * 100}, "serve_args", "64"),
])
def test_unbounded_job_bench_settings_are_a_400_naming_field_and_bound(api_client, world, bench, key,
                                                                       bound: str) -> None:
    body = {"model": "model-1", "hardware": "hw-1", "bench": bench}
    before = Job.objects.count()
    response = api_client.post("/api/v1/jobs/", body, format="json", **auth(world["admin"]))
    assert response.status_code == 400, response.content
    message = response.json()["bench"][key][0]
    assert bound in message, message
    assert Job.objects.count() == before


def test_bounded_bench_settings_are_accepted(api_client, world, monkeypatch) -> None:
    monkeypatch.setattr(job_services, "do_dispatch_job", lambda job_id: None)
    bench = {"seed": 7, "input_len": 4096, "output_len": 256, "num_prompts": 64, "concurrency": [1, 8, 64],
             "request_rate": 2.5, "comm_max_bytes": 1 << 30}
    response = api_client.post("/api/v1/jobs/", {"model": "model-1", "hardware": "hw-1", "bench": bench},
                               format="json", **auth(world["admin"]))
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["bench"] == bench


@pytest.mark.parametrize("query", [{"hardware": "\r"}, {"model": 'x"; filename=evil.exe'},
                                   {"model": "a\r\nSet-Cookie: x=1"}, {"hardware": "é/../\\"}])
@pytest.mark.parametrize("url", ["/api/v1/benchmarks/", "/api/v1/benchmarks/regressions/"])
def test_csv_export_filenames_are_built_from_safe_values(api_client, world, url: str, query: dict) -> None:
    response = api_client.get(url, {**query, "format": "csv"}, **auth(world["admin"]))
    assert response.status_code in (200, 404), response.content  # 404: no such model (the header is still set)
    disposition = response["Content-Disposition"]
    assert disposition.count("filename=") == 1 and disposition.count(";") == 1 and "\r" not in disposition and "\n" not in disposition
    assert re.fullmatch(r'attachment; filename="[A-Za-z0-9._-]+\.csv"', disposition), disposition


def test_time_offsets_postgresql_cannot_hold_are_converted_or_refused(api_client, world) -> None:
    """Python accepts offsets up to ±23:59, PostgreSQL only to ±15:59: a filter or an event time with +16:29 was a
    500 (found by the schemathesis run)."""
    admin = auth(world["admin"])
    response = api_client.get("/api/v1/models/", {"released_before": "2030-07-28T14:24:30+16:29"}, **admin)
    assert response.status_code == 200, response.content
    response = api_client.get("/api/v1/models/", {"released_after": "9999-12-31T23:30:00-16:00"}, **admin)
    assert response.status_code == 400 and "released_after" in response.json()
    for param in ("since", "until"):
        response = api_client.get("/api/v1/benchmarks/", {param: "2026-01-01T00:00:00+16:29"}, **admin)
        assert response.status_code == 200, response.content
    events = [{"seq": 1, "ts": "2026-01-01T00:00:00+16:29", "kind": "log"}]
    response = api_client.post(f"/api/v1/jobs/{world['job'].pk}/events/", events, format="json",
                               **auth(world["agent"]))
    assert response.status_code == 200, response.content
    stored = JobEvent.objects.get(job=world["job"], seq=1).ts
    assert stored.isoformat() == "2025-12-31T07:31:00+00:00"


@pytest.mark.django_db(False)
def test_the_depth_scan_agrees_with_the_parsed_document_on_tricky_strings() -> None:
    """Brackets, quotes and backslashes inside strings and keys never count: 500 seeded documents, 1 to 90 deep."""
    from apps.core.api.parsers import MAX_JSON_DEPTH, json_depth

    rng = random.Random(16)
    alphabet = ["[", "]", "{", "}", '"', "\\\\", "x", "\\n", "é"]

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))

    def document(depth: int) -> Any:
        if depth == 0:
            return text()
        if rng.random() < 0.5:
            return [text(), document(depth - 1)][:: rng.choice((1, -1))]
        return {text(): document(depth - 1), text() + "k": text()}

    def depth_of(value: Any) -> int:
        children = value if isinstance(value, list) else value.values() if isinstance(value, dict) else None
        return 0 if children is None else 1 + max(map(depth_of, children), default=0)

    for _ in range(500):
        doc = document(rng.randint(1, 90))
        raw = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode()
        want = depth_of(doc)
        if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
            assert json_depth(raw) == want, raw[:200]
        else:
            assert want <= MAX_JSON_DEPTH
