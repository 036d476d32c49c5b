"""What ``day0 demo`` (and the end-to-end benchmark) put into the portal: the tiny demo model registered as a
release, an agent token for the CPU hardware, and the portal's own Celery worker. Portal side: Django is set up
on the demo's data folder before these run. The agent itself is started by ``agents.worker.demo.start_agent``,
which holds no database settings and imports no Django."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from agents.worker.agent_state import data_dir

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODELS = {"qwen3-moe": "tiny-qwen3-moe", "mixtral": "tiny-mixtral", "llama": "tiny-llama",
               "qwen3": "tiny-qwen3", "deepseek-v3": "tiny-deepseek-v3"}


def ensure_demo_model(arch: str = "qwen3-moe", *, org_slug: str = "day0-demo") -> tuple[str, Path]:
    """Builds (once) the tiny ``arch`` model and registers it as a public release; returns (slug, models_dir)."""
    from agents.runtime.testing.make_model import cached_model

    if arch not in DEMO_MODELS:
        raise ValueError(f"unknown demo architecture {arch!r}; choose one of {', '.join(DEMO_MODELS)}")
    slug = DEMO_MODELS[arch]
    return slug, register_demo_release(slug, f"Tiny {arch} (random weights)", cached_model(arch), org_slug=org_slug)


def register_demo_release(slug: str, name: str, model_dir: Path, *, org_slug: str = "day0-demo") -> Path:
    """Registers ``model_dir`` as the public release ``slug`` (once) and links it where the demo agent looks for
    models by slug; returns that models folder."""
    from apps.accounts.models import Organization
    from apps.catalog.models import ModelRelease
    from apps.catalog.services import do_create_model_release

    config = json.loads((model_dir / "config.json").read_text())
    if not ModelRelease.objects.filter(slug=slug).exists():
        org, _ = Organization.objects.get_or_create(slug=org_slug, defaults={"name": "Day-0 demo"})
        # reference_source: the demo's CPU host (marked reference) computes the release's reference run first
        do_create_model_release(slug=slug, name=name, organization=org, config=config,
                                released_at=datetime.now(UTC), visibility="public", modalities=["text"],
                                reference_source=str(model_dir.resolve()))
    models_dir = data_dir() / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    link = models_dir / slug
    if link.is_symlink() and link.resolve() != model_dir.resolve():
        link.unlink()
    if not link.exists():
        link.symlink_to(model_dir.resolve())
    return models_dir


def reference_line(base: str, slug: str) -> str:
    """The console line naming the release's newest reference run (it runs first: the demo job waits for it)."""
    from apps.references.models import ReferenceRun

    run = ReferenceRun.objects.filter(release__slug=slug).order_by("-id").first()
    if run is None or run.job_id is None:
        return "  reference   none queued: align's end to end and eval will say \"awaiting reference\"\n"
    return (f"  reference   {base}/jobs/{run.job_id}/   (the release's reference run: transformers fp32 on this "
            f"host, first)\n")


def make_agent_token(hardware: str = "cpu", *, org_slug: str = "day0-demo", username: str = "admin") -> str:
    """A fresh agent token bound to ``hardware`` (the secret is shown only now), minted by ``username`` through
    ``check_create_api_token``: the demo admin is a superuser (created as one here if missing), as the shared
    catalog entries' agent tokens need staff."""
    from django.contrib.auth import get_user_model

    from apps.accounts.access import actor_of
    from apps.accounts.choices import Role, Scope
    from apps.accounts.models import Membership, Organization
    from apps.accounts.services import check_create_api_token
    from apps.catalog.models import Hardware
    from apps.catalog.seed import ensure_demo_admin

    hw = Hardware.objects.select_related("organization").filter(slug=hardware).first()
    if hw is None:
        raise ValueError(f"no hardware {hardware!r} in the catalog (seed it first)")
    org, _ = Organization.objects.get_or_create(slug=org_slug, defaults={"name": "Day-0 demo"})
    user = get_user_model().objects.filter(username=username).first() or ensure_demo_admin(username)[0]
    Membership.objects.get_or_create(organization=org, user=user, defaults={"role": Role.ADMIN})
    _, secret = check_create_api_token(actor_of(user), organization=org, name=f"agent-{hardware}",
                                       scopes=[Scope.AGENT], hardware=hw)
    return secret


def start_portal_worker(*, env: dict[str, str] | None = None, log_path: Path | None = None,
                        preexec_fn: object = None) -> subprocess.Popen:
    """The portal's own Celery worker with beat (queue ``portal``): runs the periodic lost-job detection. It
    shares the portal's environment (database included); agents never run it."""
    log_path = log_path or data_dir() / "logs" / "portal-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    run_env = {**os.environ, **(env or {})}
    queue = run_env.get("DAY0_CELERY_DEFAULT_QUEUE", "portal")
    command = [sys.executable, "-m", "celery", "-A", "day0portal", "worker", "-B", "-Q", queue, "--pool", "solo",
               "--loglevel", "INFO", "-s", str(log_path.with_suffix(".beat")), "-n", f"portal-{os.getpid()}@%h"]
    return subprocess.Popen(command, cwd=ROOT, env=run_env, stdout=log_path.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=preexec_fn)
