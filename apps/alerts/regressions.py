"""The regressions of a new benchmark run (the ``benchmark_recorded`` event's receiver queues this task off the
request path): one alert per run, through ``services.do_publish_alert``."""

from __future__ import annotations

from celery import shared_task

from apps.accounts.access import Actor
from apps.alerts import services
from apps.alerts.choices import AlertKind
from apps.alerts.models import Delivery
from apps.benchmarks.selectors import SeriesQuery, load_series, regression_dict
from apps.evidence.models import BenchmarkRun


@shared_task(name="alerts.benchmark_run", ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
             max_retries=3)
def alert_benchmark_run_task(run_id: int) -> None:
    """Looks for regressions in a new benchmark run (``do_alert_benchmark_run``)."""
    do_alert_benchmark_run(run_id)


def do_alert_benchmark_run(run_id: int) -> list[Delivery]:
    """Publishes the regressions a new benchmark run shows against its series' history (the detector of
    ``benchmarks.regressions`` over ``benchmarks.selectors.load_series``): one alert per run, listing every
    flagged metric and configuration."""
    run = BenchmarkRun.objects.select_related("model", "hardware").filter(pk=run_id).first()
    if run is None:
        return []
    system = Actor(is_staff=True)
    series = load_series(system, SeriesQuery(model=run.model.slug, hardware=run.hardware.slug))
    flagged = [regression_dict(s, r) for s in series for r in s.regressions if r.ref[0] == run.pk]
    if not flagged:
        return []
    worst = max(flagged, key=lambda r: r["z"])
    summary = (f"{run.model.slug} on {run.hardware.slug}: {len(flagged)} benchmark regression"
               f"{'s' if len(flagged) != 1 else ''}, worst {worst['metric']} {worst['value']:.4g} {worst['unit']} "
               f"vs median {worst['baseline_median']:.4g} ({worst['ratio']:.2f}x, z={worst['z']:.1f}) at "
               f"{worst['label']}")
    return services.do_publish_alert(AlertKind.REGRESSION, summary=summary, model=run.model, hardware=run.hardware,
                            data={"run": run.pk, "job": worst["job"], "regressions": flagged[:50]})
