"""Helpers for ``day0 demo`` (and the end-to-end benchmark): a CPU agent for hardware ``cpu`` on the embedded
default, a tiny MoE model registered as a release, and a job submitted over REST.

The portal process calls these after Django is set up on the same data folder: the agent and the portal share
the kombu filesystem broker under ``$DAY0_DATA_DIR/broker``. The agent process gets no database settings."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODELS = {"qwen3-moe": "tiny-qwen3-moe", "mixtral": "tiny-mixtral", "llama": "tiny-llama",
               "qwen3": "tiny-qwen3", "deepseek-v3": "tiny-deepseek-v3"}


@dataclass
class DemoJob:
    job_id: int
    job_url: str
    model_slug: str
    agent: subprocess.Popen
    agent_log: Path


def data_dir() -> Path:
    return Path(os.environ.get("DAY0_DATA_DIR") or ROOT / "var").resolve()


def ensure_demo_model(arch: str = "qwen3-moe", *, org_slug: str = "day0-demo") -> tuple[str, Path]:
    """Builds (once) the tiny ``arch`` model and registers it as a public release; returns (slug, models_dir)."""
    import json

    from agents.runtime.testing.make_model import cached_model
    from apps.accounts.models import Organization
    from apps.catalog.models import ModelRelease
    from apps.catalog.services import do_create_model_release

    if arch not in DEMO_MODELS:
        raise ValueError(f"unknown demo architecture {arch!r}; choose one of {', '.join(DEMO_MODELS)}")
    model_dir = cached_model(arch)
    slug = DEMO_MODELS[arch]
    config = json.loads((model_dir / "config.json").read_text())
    if not ModelRelease.objects.filter(slug=slug).exists():
        org, _ = Organization.objects.get_or_create(slug=org_slug, defaults={"name": "Day-0 demo"})
        do_create_model_release(slug=slug, name=f"Tiny {arch} (random weights)", organization=org, config=config,
                                released_at=datetime.now(UTC), visibility="public", modalities=["text"])
    models_dir = data_dir() / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    link = models_dir / slug
    if link.is_symlink() and link.resolve() != model_dir.resolve():
        link.unlink()
    if not link.exists():
        link.symlink_to(model_dir.resolve())
    return slug, models_dir


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


def agent_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The agent's environment: the embedded broker folder, and no database or Django settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DAY0_DATABASE", "DJANGO_", "DAY0_SECRET"))}
    env.update(DAY0_DATA_DIR=str(data_dir()), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def start_agent(portal_url: str, token: str, *, hardware: str = "cpu", models_dir: Path | None = None,
                log_path: Path | None = None, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """Starts ``day0 agent`` in its own process group; returns the process and its log file."""
    log_path = log_path or data_dir() / "logs" / f"agent-{hardware}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "day0portal.cli", "agent", "--hardware", hardware, "--portal", portal_url,
               "--token", token, "--device", "cpu"]
    if models_dir is not None:
        command += ["--models-dir", str(models_dir)]
    process = subprocess.Popen(command, cwd=ROOT, env=agent_environment(env), stdout=log_path.open("a"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    return process, log_path


def start_portal_worker(*, env: dict[str, str] | None = None, log_path: Path | None = None) -> subprocess.Popen:
    """The portal's own Celery worker with beat (queue ``portal``): runs the periodic lost-job detection. It
    shares the portal's environment (database included); agents never run it."""
    log_path = log_path or data_dir() / "logs" / "portal-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    run_env = {**os.environ, **(env or {})}
    queue = run_env.get("DAY0_CELERY_DEFAULT_QUEUE", "portal")
    command = [sys.executable, "-m", "celery", "-A", "day0portal", "worker", "-B", "-Q", queue, "--pool", "solo",
               "--loglevel", "INFO", "-s", str(log_path.with_suffix(".beat")), "-n", f"portal-{os.getpid()}@%h"]
    return subprocess.Popen(command, cwd=ROOT, env=run_env, stdout=log_path.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def submit_job(portal_url: str, token: str, *, model: str, hardware: str = "cpu", stages: list[str] | None = None,
               dtype: str = "float32", **spec: Any) -> dict[str, Any]:
    """POST ``/api/v1/jobs/``; raises ``RuntimeError`` with the portal's answer when refused."""
    body: dict[str, Any] = {"model": model, "hardware": hardware, "dtype": dtype, **spec}
    if stages:
        body["stages"] = stages
    response = httpx.post(f"{portal_url.rstrip('/')}/api/v1/jobs/", json=body, timeout=30,
                          headers={"Authorization": f"Token {token}"})
    if response.status_code != 201:
        raise RuntimeError(f"job submission refused ({response.status_code}): {response.text[:500]}")
    return response.json()


def run_demo(portal_url: str, submit_token: str, *, arch: str = "qwen3-moe", hardware: str = "cpu",
             stages: list[str] | None = None, dtype: str = "float32") -> DemoJob:
    """Agent + tiny model + a job: everything the README's first command shows. Django must be set up."""
    slug, models_dir = ensure_demo_model(arch)
    agent_token = make_agent_token(hardware)
    agent, log_path = start_agent(portal_url, agent_token, hardware=hardware, models_dir=models_dir)
    job = submit_job(portal_url, submit_token, model=slug, hardware=hardware, stages=stages, dtype=dtype)
    return DemoJob(job_id=int(job["id"]), job_url=f"{portal_url.rstrip('/')}/jobs/{job['id']}/", model_slug=slug,
                   agent=agent, agent_log=log_path)


def stop_agent(process: subprocess.Popen, timeout: float = 20) -> None:
    """Stops an agent started by ``start_agent`` (its whole process group)."""
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
