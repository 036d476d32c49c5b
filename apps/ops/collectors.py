"""What the portal's ``/metrics`` answers: gauges read from the database and the broker when scraped (jobs by
state and hardware, queue depth, stuck jobs, agents and their heartbeats) and the counters every process adds to
(``apps.ops.store``: events ingested and their lag, results refused, tier changes, WebSocket connections, Celery
tasks). Names carry the ``day0_portal_`` prefix."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count, Max
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from apps.ops import store

log = logging.getLogger(__name__)
P = "day0_portal_"
WAITING_STATES = ("queued", "dispatched")  # a job on its way to an agent, not yet claimed


def broker_queue_depths(slugs: list[str], timeout: float = 2.0) -> dict[str, tuple[int, int]] | None:
    """Messages and consumers of each hardware's queue (``hw.<slug>``) by a passive declare on the portal's
    broker (RabbitMQ answers both; Redis and the filesystem transport answer the messages, consumers 0); None
    when the broker cannot be reached."""
    from kombu import Connection

    from contract.queues import hardware_queue

    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=timeout,
                        transport_options=dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}))) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
            out: dict[str, tuple[int, int]] = {}
            for slug in slugs:
                channel = conn.channel()
                try:
                    _name, messages, consumers = channel.queue_declare(queue=hardware_queue(slug), passive=True)
                    out[slug] = (int(messages), int(consumers))
                except conn.channel_errors:  # never declared: nothing queued there yet
                    out[slug] = (0, 0)
                finally:
                    try:
                        channel.close()
                    except Exception:  # noqa: BLE001 (a channel the broker already closed)
                        pass
            return out
    except Exception:  # noqa: BLE001 (connection refused, timeouts, bad credentials)
        log.warning("broker unreachable for queue depths", exc_info=True)
        return None


class PortalCollector(Collector):
    """Reads the database, the broker and the shared counters at each scrape."""

    def describe(self) -> list:
        return []  # everything is read at scrape time: registering must not query the database

    def collect(self) -> Iterator[Any]:
        started = time.perf_counter()
        yield from self._jobs()
        yield from self._agents()
        yield from self._counters()
        scrape = GaugeMetricFamily(f"{P}scrape_seconds", "Time this scrape took to read the portal's state.")
        scrape.add_metric([], time.perf_counter() - started)
        yield scrape

    def _jobs(self) -> Iterator[Any]:
        from apps.catalog.models import Hardware
        from apps.jobs.dispatch import lost_after, stuck_after
        from apps.jobs.models import Job

        jobs = GaugeMetricFamily(f"{P}jobs", "Jobs by state and hardware.", labels=["state", "hardware"])
        waiting: dict[str, int] = {}
        for row in Job.objects.values("state", "hardware__slug").annotate(n=Count("id")).order_by():
            jobs.add_metric([row["state"], row["hardware__slug"]], row["n"])
            if row["state"] in WAITING_STATES:
                waiting[row["hardware__slug"]] = waiting.get(row["hardware__slug"], 0) + row["n"]
        yield jobs
        now = timezone.now()
        stuck = GaugeMetricFamily(f"{P}jobs_stuck", "Jobs that should be moving and are not: dispatched and "
                                  "unclaimed past DAY0_JOB_STUCK_SECONDS, or running on a silent agent.",
                                  labels=["hardware", "reason"])
        unclaimed = (Job.objects.filter(state="dispatched", dispatched_at__lt=now - stuck_after())
                     .values("hardware__slug").annotate(n=Count("id")).order_by())
        for row in unclaimed:
            stuck.add_metric([row["hardware__slug"], "unclaimed"], row["n"])
        silent = (Job.objects.filter(state="running", agent__last_heartbeat_at__lt=now - lost_after())
                  .values("hardware__slug").annotate(n=Count("id")).order_by())
        for row in silent:
            stuck.add_metric([row["hardware__slug"], "agent_silent"], row["n"])
        yield stuck
        slugs = list(Hardware.objects.order_by("slug").values_list("slug", flat=True))
        depths = broker_queue_depths(slugs)
        up = GaugeMetricFamily(f"{P}broker_up", "1 when the broker answered this scrape's queue depths; 0 when "
                               "it did not and queue depth falls back to the database.")
        up.add_metric([], 0 if depths is None else 1)
        yield up
        depth = GaugeMetricFamily(f"{P}queue_depth", "Jobs waiting for an agent per hardware: messages on the "
                                  "broker's hw.<slug> queue (source=broker), or queued and dispatched jobs in the "
                                  "database when the broker is unreachable (source=database).",
                                  labels=["hardware", "source"])
        consumers = GaugeMetricFamily(f"{P}queue_consumers", "Consumers of each hardware's queue (RabbitMQ only).",
                                      labels=["hardware"])
        for slug in slugs:
            if depths is None:
                depth.add_metric([slug, "database"], waiting.get(slug, 0))
            else:
                depth.add_metric([slug, "broker"], depths[slug][0])
                consumers.add_metric([slug], depths[slug][1])
        yield depth
        yield consumers
        queued = GaugeMetricFamily(f"{P}jobs_waiting", "Queued and dispatched jobs per hardware in the database.",
                                   labels=["hardware"])
        for slug in slugs:
            queued.add_metric([slug], waiting.get(slug, 0))
        yield queued

    def _agents(self) -> Iterator[Any]:
        from apps.fleet.models import ONLINE_WINDOW, Agent

        now = timezone.now()
        online = GaugeMetricFamily(f"{P}agents_online", "Agents whose last heartbeat is within the online window.",
                                   labels=["hardware"])
        total = GaugeMetricFamily(f"{P}agents", "Registered agents.", labels=["hardware"])
        rows = (Agent.objects.values("hardware__slug")
                .annotate(n=Count("id"), newest=Max("last_heartbeat_at")).order_by())
        counted = {r["hardware__slug"]: r for r in rows}
        live = dict(Agent.objects.filter(last_heartbeat_at__gte=now - ONLINE_WINDOW).values("hardware__slug")
                    .annotate(n=Count("id")).order_by().values_list("hardware__slug", "n"))
        for slug, row in sorted(counted.items()):
            total.add_metric([slug], row["n"])
            online.add_metric([slug], live.get(slug, 0))
        yield total
        yield online
        age = GaugeMetricFamily(f"{P}agent_heartbeat_age_seconds", "Seconds since each agent's last heartbeat.",
                                labels=["hardware", "agent"])
        for agent_id, slug, hostname, beat in Agent.objects.exclude(last_heartbeat_at=None).values_list(
                "id", "hardware__slug", "hostname", "last_heartbeat_at").order_by("id"):
            age.add_metric([slug, f"{agent_id}:{hostname}"], (now - beat).total_seconds())
        yield age

    def _counters(self) -> Iterator[Any]:
        for name, doc, labels in COUNTERS:
            family = CounterMetricFamily(f"{P}{name}", doc, labels=labels)
            for values, total in sorted(store.read_counter(name).items()):
                family.add_metric(list(values), total)
            yield family
        gauge = GaugeMetricFamily(f"{P}websocket_connections", "Open WebSocket connections by route.",
                                  labels=["route"])
        for values, total in sorted(store.read_counter("websocket_connections").items()):
            gauge.add_metric(list(values), max(total, 0))
        yield gauge
        for name, doc, labels, buckets in HISTOGRAMS:
            family = HistogramMetricFamily(f"{P}{name}", doc, labels=labels)
            for values, entry in sorted(store.read_histogram(name, buckets).items()):
                family.add_metric(list(values), [(str(b), c) for b, c in entry["buckets"]]
                                  + [("+Inf", entry["count"])], entry["sum"])
            yield family


COUNTERS = (
    ("events_ingested", "Agent events stored (new to the database).", ["hardware"]),
    ("results_refused", "Result posts refused, by reason.", ["reason", "status"]),
    ("tier_changes", "Cell tier changes, up or down.", ["hardware", "direction"]),
    ("celery_tasks", "Celery tasks run by the portal's workers, by outcome.", ["task", "outcome"]),
    ("websocket_opened", "WebSocket connections accepted, by route.", ["route"]),
)
HISTOGRAMS = (
    ("event_ingest_lag_seconds", "From an event's timestamp on the agent to its storage by the portal.",
     ["hardware"], store.LAG_BUCKETS),
    ("celery_task_seconds", "Celery task run time.", ["task"], store.TASK_BUCKETS),
)


def render() -> bytes:
    """The exposition text of one scrape."""
    registry = CollectorRegistry()
    registry.register(PortalCollector())
    return generate_latest(registry)
