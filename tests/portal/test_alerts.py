"""Alerts: organizations subscribe webhooks; regressions, tier drops, failed jobs and stack changes reach them
as signed JSON POSTs (a real local HTTP receiver), retried after a 5xx through the Celery task (run eagerly)."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from apps.alerts import signing
from apps.alerts.models import Delivery, Subscription
from apps.evidence.services import do_record_stage_results
from apps.jobs.choices import JobState
from apps.jobs.services import do_transition_job
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token
from tests.portal.reports import PASSING

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _loopback_receivers_allowed(monkeypatch) -> None:
    """The tests' receiver listens on 127.0.0.1: private and loopback URLs are allowed here (off by default)."""
    monkeypatch.setenv("DAY0_ALERTS_ALLOW_PRIVATE_URLS", "1")


class Receiver:
    """A real HTTP server on a free port: records every POST and answers the queued status codes (then 200)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.codes: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append({"headers": dict(self.headers), "body": body, "path": self.path})
                code = receiver.codes.pop(0) if receiver.codes else 200
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def eager_celery() -> Iterator[None]:
    from celery import current_app

    from day0portal.celery import app

    # shared tasks run on the current app: an earlier test may have made the agent's Celery app current
    previous_app = current_app._get_current_object()
    app.set_current()
    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = before
        previous_app.set_current()


def _subscribe(org, url: str, kinds: list[str], fmt: str = "json", secret: str = "s3cret-key-0123456789") -> Subscription:
    return Subscription.objects.create(organization=org, name="hook", url=url, kinds=kinds, format=fmt,
                                       secret=secret)


def _bench(ttft_scale: float) -> dict[str, Any]:
    section = copy.deepcopy(PASSING["bench"])
    for run in section["runs"]:
        for stat in run["ttft_ms"]:
            run["ttft_ms"][stat] *= ttft_scale
    return section


def test_a_planted_regression_reaches_the_receiver_signed_and_is_retried_after_a_500(
        receiver: Receiver, eager_celery: None, django_capture_on_commit_callbacks) -> None:
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    sub = _subscribe(OrganizationFactory(), receiver.url, ["regression"])
    for i in range(6):  # a steady history (their on_commit hooks are not run: no alert for them)
        do_record_stage_results(JobFactory(model=model, hardware=hardware), {"bench": _bench(1.0 + 0.01 * (i % 2))})
    assert Delivery.objects.count() == 0
    receiver.codes = [500]
    with django_capture_on_commit_callbacks(execute=True):
        do_record_stage_results(JobFactory(model=model, hardware=hardware), {"bench": _bench(3.0)})
    assert len(receiver.requests) == 2, "one 500, then the retry"
    for request in receiver.requests:
        headers, body = request["headers"], request["body"]
        assert headers["Content-Type"] == "application/json" and headers[signing.EVENT_HEADER] == "regression"
        assert signing.verify(sub.secret, headers[signing.TIMESTAMP_HEADER], body, headers[signing.SIGNATURE_HEADER],
                              now=time.time())
        assert not signing.verify("another-secret-0000", headers[signing.TIMESTAMP_HEADER], body,
                                  headers[signing.SIGNATURE_HEADER])
        expected = signing.sign(sub.secret, int(headers[signing.TIMESTAMP_HEADER]), body)
        assert headers[signing.SIGNATURE_HEADER] == expected and expected.startswith("sha256=")
    event = json.loads(receiver.requests[-1]["body"])
    assert event["kind"] == "regression" and event["model"] == model.slug and event["hardware"] == hardware.slug
    metrics = {r["metric"] for r in event["data"]["regressions"]}
    assert "ttft_ms_p50" in metrics and "tpot_ms_p50" not in metrics
    assert receiver.requests[0]["headers"][signing.DELIVERY_HEADER] == event["id"]  # same id: receivers dedupe
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.response_code, delivery.last_error) == ("delivered", 2, 200, "")


def test_a_4xx_fails_at_once_and_a_dead_receiver_gives_up_after_the_attempt_budget(
        receiver: Receiver, eager_celery: None, django_capture_on_commit_callbacks, monkeypatch) -> None:
    from apps.alerts import delivery as delivery_module

    org = OrganizationFactory()
    job = JobFactory(model=ModelReleaseFactory(organization=org))
    _subscribe(org, receiver.url, ["job_failed"])
    receiver.codes = [410]
    with django_capture_on_commit_callbacks(execute=True):
        do_transition_job(job, JobState.FAILED, failed_stage="load", error="shard 2 digest differs")
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 1, 410)
    assert "410" in delivery.last_error and len(receiver.requests) == 1
    event = json.loads(receiver.requests[0]["body"])
    assert event["data"]["failed_stage"] == "load" and "digest differs" in event["summary"]

    monkeypatch.setattr(delivery_module, "MAX_ATTEMPTS", 3)
    Subscription.objects.update(url="http://127.0.0.1:9/closed")  # discard port: nothing listens
    with django_capture_on_commit_callbacks(execute=True):
        do_transition_job(JobFactory(model=job.model, hardware=job.hardware), JobState.FAILED, error="x")
    dead = Delivery.objects.order_by("-id").first()
    assert dead.status == "failed" and dead.attempts == 3 and dead.response_code is None
    assert "gave up after 3 attempts" in dead.last_error


def test_an_embargoed_models_events_reach_only_its_own_organization(
        receiver: Receiver, eager_celery: None, django_capture_on_commit_callbacks) -> None:
    owner, other = OrganizationFactory(), OrganizationFactory()
    own = _subscribe(owner, receiver.url, ["job_failed"], fmt="slack")
    _subscribe(other, receiver.url + "-other", ["job_failed"])
    private = ModelReleaseFactory(organization=owner, visibility="private", released_at=None)
    with django_capture_on_commit_callbacks(execute=True):
        do_transition_job(JobFactory(model=private), JobState.FAILED, error="boom")
    assert [d.subscription_id for d in Delivery.objects.all()] == [own.pk]
    assert [r["path"] for r in receiver.requests] == ["/hook"]
    slack = json.loads(receiver.requests[0]["body"])
    assert list(slack) == ["text"] and private.slug in slack["text"] and "boom" in slack["text"]
    public = ModelReleaseFactory(organization=owner)
    with django_capture_on_commit_callbacks(execute=True):
        do_transition_job(JobFactory(model=public), JobState.FAILED, error="boom")
    assert sorted(r["path"] for r in receiver.requests[1:]) == ["/hook", "/hook-other"]


def test_a_tier_drop_is_published(receiver: Receiver, eager_celery: None, django_capture_on_commit_callbacks) -> None:
    from tests.portal.reports import failing

    model, hardware = ModelReleaseFactory(), HardwareFactory()
    _subscribe(model.organization, receiver.url, ["tier_drop"])
    from apps.matrix.services import recompute_cell

    do_record_stage_results(JobFactory(model=model, hardware=hardware), {"plan": PASSING["plan"]})
    assert recompute_cell(model.pk, hardware.pk).tier == 1
    do_record_stage_results(JobFactory(model=model, hardware=hardware), {"plan": failing("plan")})
    with django_capture_on_commit_callbacks(execute=True):
        assert recompute_cell(model.pk, hardware.pk).tier == 0
    event = json.loads(receiver.requests[0]["body"])
    assert event["kind"] == "tier_drop" and (event["data"]["from_tier"], event["data"]["to_tier"]) == (1, 0)


def test_subscriptions_api_validates_never_echoes_the_secret_and_shows_the_delivery_log(api_client) -> None:
    org = OrganizationFactory()
    admin = make_token(organization=org, role="admin")
    submitter = make_token(organization=org)
    body = {"name": "ops", "url": "https://hooks.example.com/day0", "kinds": ["regression", "tier_drop"]}
    assert api_client.post("/api/v1/alert-subscriptions/", body, format="json", **auth(submitter)).status_code == 403
    for bad, field in (({"url": "ftp://x/y"}, "url"), ({"url": "https://" + "a" * 2000 + ".com"}, "url"),
                       ({"url": "https://user:pw@x.com/"}, "url"), ({"url": "http:///nohost"}, "url"),
                       ({"kinds": ["earthquake"]}, "kinds"), ({"kinds": []}, "kinds"), ({"format": "xml"}, "format"),
                       ({"secret": "short"}, "secret"), ({"name": ""}, "name")):
        answer = api_client.post("/api/v1/alert-subscriptions/", {**body, **bad}, format="json", **auth(admin))
        assert answer.status_code == 400 and field in answer.json(), (bad, answer.json())
    assert Subscription.objects.count() == 0
    created = api_client.post("/api/v1/alert-subscriptions/", body, format="json", **auth(admin))
    assert created.status_code == 201 and len(created.json()["secret"]) >= 16
    secret = created.json()["secret"]
    sub_id = created.json()["id"]
    read = api_client.get(f"/api/v1/alert-subscriptions/{sub_id}/", **auth(admin))
    assert read.status_code == 200 and "secret" not in read.json() and secret not in read.content.decode()
    changed = api_client.patch(f"/api/v1/alert-subscriptions/{sub_id}/", {"secret": "n" * 20, "format": "slack"},
                               format="json", **auth(admin))
    assert changed.status_code == 200 and "secret" not in changed.json() and changed.json()["format"] == "slack"
    assert Subscription.objects.get().secret == "n" * 20
    outsider = make_token(organization=OrganizationFactory(), role="admin")
    assert api_client.get(f"/api/v1/alert-subscriptions/{sub_id}/", **auth(outsider)).status_code == 404
    Delivery.objects.create(subscription_id=sub_id, kind="regression", event={"kind": "regression"},
                            status="failed", attempts=6, response_code=503, last_error="HTTP 503")
    log = api_client.get(f"/api/v1/alert-deliveries/?subscription={sub_id}", **auth(admin)).json()["results"]
    assert [(d["status"], d["attempts"], d["response_code"], d["last_error"]) for d in log] == [
        ("failed", 6, 503, "HTTP 503")]
    assert api_client.get("/api/v1/alert-deliveries/", **auth(outsider)).json()["results"] == []
    again = api_client.post(f"/api/v1/alert-deliveries/{log[0]['id']}/redeliver/", **auth(admin))
    assert again.status_code == 202 and (again.json()["status"], again.json()["attempts"]) == ("pending", 0)
    assert api_client.post(f"/api/v1/alert-deliveries/{log[0]['id']}/redeliver/",
                           **auth(outsider)).status_code == 404


@pytest.mark.parametrize(("url", "rule"), [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://10.1.2.3:8080/hook", "private address: refused unless DAY0_ALERTS_ALLOW_PRIVATE_URLS"),
    ("http://192.168.0.7/hook", "private"),
    ("http://[::1]:9000/hook", "loopback"),
    ("http://localhost:9000/hook", "host 'localhost' resolves to"),
    ("http://[::ffff:127.0.0.1]/hook", "loopback"),
    ("http://0.0.0.0/hook", "unspecified (this host)"),
    ("http://100.64.0.9/hook", "non-public"),
])
def test_internal_destinations_are_a_400_naming_the_rule(api_client, monkeypatch, url: str, rule: str) -> None:
    monkeypatch.setenv("DAY0_ALERTS_ALLOW_PRIVATE_URLS", "0")
    org = OrganizationFactory()
    admin = make_token(organization=org, role="admin")
    body = {"name": "ops", "url": url, "kinds": ["regression"]}
    answer = api_client.post("/api/v1/alert-subscriptions/", body, format="json", **auth(admin))
    assert answer.status_code == 400 and rule in str(answer.json()["url"]), answer.json()
    assert Subscription.objects.count() == 0


def test_the_setting_allows_private_receivers_but_never_link_local(api_client) -> None:
    admin = make_token(organization=OrganizationFactory(), role="admin")
    body = {"name": "ops", "url": "http://10.1.2.3/hook", "kinds": ["regression"]}
    assert api_client.post("/api/v1/alert-subscriptions/", body, format="json", **auth(admin)).status_code == 201
    metadata = {**body, "url": "http://169.254.169.254/"}
    answer = api_client.post("/api/v1/alert-subscriptions/", metadata, format="json", **auth(admin))
    assert answer.status_code == 400 and "never" in str(answer.json()["url"])


def test_a_delivery_checks_the_address_again_and_is_refused_without_retrying(receiver: Receiver, monkeypatch) -> None:
    from apps.alerts.delivery import do_attempt_delivery

    sub = _subscribe(OrganizationFactory(), receiver.url.replace("127.0.0.1", "localhost"), ["job_failed"])
    first = Delivery.objects.create(subscription=sub, kind="job_failed", event={"kind": "job_failed"})
    assert do_attempt_delivery(first.pk).status == "delivered"  # by name, to the checked address
    assert len(receiver.requests) == 1 and receiver.requests[0]["headers"]["Host"].startswith("localhost:")
    monkeypatch.setenv("DAY0_ALERTS_ALLOW_PRIVATE_URLS", "0")  # saved while allowed; refused when delivered
    second = Delivery.objects.create(subscription=sub, kind="job_failed", event={"kind": "job_failed"})
    refused = do_attempt_delivery(second.pk)
    assert refused.status == "failed" and refused.attempts == 1 and refused.next_attempt_at is None
    assert "refused" in refused.last_error and "loopback" in refused.last_error
    assert len(receiver.requests) == 1
