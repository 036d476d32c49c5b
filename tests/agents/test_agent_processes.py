"""Process hygiene of agents and the demo: children die with their parent, SIGTERM stops an agent within seconds
even mid-job with its portal and broker gone, the agent token never shows in ``ps``, and ``day0 demo`` exits
within seconds on SIGTERM (or when killed) taking every process it started with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.runtime.testing.make_model import cached_model
from agents.worker.lifecycle import child_pids
from apps.accounts.choices import Scope
from apps.jobs import dispatch
from apps.jobs.choices import JobState
from apps.jobs.models import Job, JobEvent
from apps.jobs.services import do_transition_job
from contract import queues
from tests.agents.conftest import PortalProcess, model_config, unique_slug, wait_for
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, make_token
from tests.live_services import free_port, start_demo

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        for child in child_pids(frontier.pop()):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {p for p in pids if alive(p)}
        if not left:
            return left
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


def test_a_child_started_with_die_with_parent_ends_when_its_parent_is_killed() -> None:
    code = ("import subprocess, sys, time\n"
            "from agents.worker.lifecycle import die_with_parent\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "preexec_fn=die_with_parent)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()  # SIGKILL: the parent runs no cleanup at all
        parent.wait(timeout=10)
        assert wait_gone({child}, 5) == set()
    finally:
        parent.kill()


def test_the_demo_agent_gets_its_token_by_environment_never_on_its_command_line(tmp_path: Path,
                                                                              monkeypatch) -> None:
    from agents.worker.demo import start_agent, stop_agent

    monkeypatch.setenv("DAY0_DATA_DIR", str(tmp_path))
    secret = "d0a_" + "s3cr3t" * 6
    process, _ = start_agent(f"http://127.0.0.1:{free_port()}", secret, log_path=tmp_path / "agent.log")
    try:
        def exec_done() -> bool:
            return b"agents.worker" in Path(f"/proc/{process.pid}/cmdline").read_bytes()

        wait_for(exec_done, 20, "the agent process to start")
        ps = subprocess.run(["ps", "-eo", "pid,args", "ww"], capture_output=True, text=True).stdout
        assert secret not in ps and secret.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
        assert f"DAY0_AGENT_TOKEN={secret}".encode() in Path(f"/proc/{process.pid}/environ").read_bytes()
    finally:
        stop_agent(process)


@pytest.fixture
def private_broker(tmp_path: Path):  # noqa: ANN201
    """A Redis of the test's own, to take away while an agent consumes from it."""
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                    text=True).stdout.strip() == "PONG", 10, "the private Redis")
    yield proc, url
    proc.kill()
    proc.wait()


@pytest.mark.slow  # ~20 s: the agent starts (torch) and its job reaches the load stage
@pytest.mark.django_db(transaction=True)
def test_sigterm_stops_an_agent_mid_job_within_seconds_with_its_portal_and_broker_gone(
        tmp_path: Path, start_agent, private_broker) -> None:  # noqa: ANN001
    from celery import Celery

    broker_proc, broker_url = private_broker
    portal = PortalProcess()
    portal.start()
    model_dir = cached_model("qwen3-moe")
    org = OrganizationFactory(slug=unique_slug("org"))
    model = ModelReleaseFactory(slug=unique_slug("tiny-moe"), organization=org, config=model_config(model_dir))
    hardware = HardwareFactory(slug=unique_slug("hw"), memory_bytes=8 * 10**9, devices_per_node=1,
                               dtypes=["float32", "bfloat16"])
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / model.slug).symlink_to(model_dir)
    token = make_token(organization=org, scopes=[Scope.AGENT], hardware=hardware, name="agent")
    job = JobFactory(model=model, hardware=hardware, state=JobState.QUEUED,
                     spec={"stages": ["plan", "load", "inventory", "align", "env"], "dtype": "float32"})
    do_transition_job(job, JobState.DISPATCHED)
    sender = Celery("private-portal", broker=broker_url)
    sender.send_task(queues.RUN_JOB_TASK, args=[job.pk, dispatch.task_payload(Job.objects.get(pk=job.pk))],
                     queue=queues.hardware_queue(hardware.slug))
    spool_root = tmp_path / "spool"
    agent = start_agent(hardware.slug, token.secret, models_dir=tmp_path / "models", spool_dir=spool_root,
                        broker=broker_url, portal_url=portal.url, extra_env={"DAY0_AGENT_STOP_SECONDS": "3"})
    try:
        wait_for(lambda: JobEvent.objects.filter(job=job, kind="stage_started", stage="load").exists(), 120,
                 "the load stage to start", agent)
        portal.stop()
        broker_proc.kill()
        broker_proc.wait()
        started = time.monotonic()
        os.killpg(agent.proc.pid, signal.SIGTERM)
        agent.proc.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        portal.stop()
    print(f"agent stopped {took:.1f} s after SIGTERM")
    assert took < 6, f"the agent took {took:.1f} s to stop\n{agent.log()}"
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING  # the portal re-queues it when it sees it gone
    spooled = list(spool_root.rglob(f"job-{job.pk}.events.jsonl"))
    assert spooled and spooled[0].read_text().strip(), "undelivered events stay on disk for the next start"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_day0_demo_stops_within_seconds_and_takes_every_process_it_started(tmp_path: Path, how: str) -> None:
    process, _ = start_demo(tmp_path, until=r"job \d+: running")
    started = descendants(process.pid)
    assert len(started) >= 3, started  # the portal, its worker and the agent (and what they started)
    ps = subprocess.run(["ps", "-eo", "pid,args", "ww"], capture_output=True, text=True).stdout
    agent_lines = [line for line in ps.splitlines() if " agent --hardware" in line]
    assert agent_lines and all("--token" not in line for line in agent_lines), agent_lines
    t0 = time.monotonic()
    process.send_signal(getattr(signal, how))
    process.wait(timeout=30)
    exited = time.monotonic() - t0
    left = wait_gone(started, 10)
    took = time.monotonic() - t0
    agent_log = (tmp_path / "logs" / "agent-cpu.log").read_text()[-3000:]
    print(f"{how}: the demo exited after {exited:.1f} s, all its processes ended after {took:.1f} s")
    assert not left, f"still running {took:.1f} s after {how}: {left}\n{agent_log}"
    if how == "SIGTERM":
        assert exited < 6, f"the demo took {exited:.1f} s to exit\n{agent_log}"
    assert took < 10, f"its processes took {took:.1f} s to end"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_dispatch_imports_no_service_and_the_agent_worker_no_portal_code() -> None:
    """``apps.jobs.dispatch`` is the broker side only (services import it, never the reverse: no cycle), and
    the agent's modules, the demo's agent helpers and its commands included, import neither Django nor ``apps``
    nor ``day0portal`` nor the ``day0`` command's package (the demo's seeding lives in ``day0cli.demo_seed``)."""
    assert "apps.jobs.services" not in imported_modules(ROOT / "apps" / "jobs" / "dispatch.py")
    paths = sorted((ROOT / "agents" / "worker").rglob("*.py"))
    assert ROOT / "agents" / "worker" / "commands" / "agent.py" in paths
    for path in paths:
        portal = {m for m in imported_modules(path) if m.split(".")[0] in ("django", "apps", "day0portal", "day0cli")}
        assert not portal, (path.name, portal)


def test_an_agent_token_file_must_be_readable_by_its_owner_only(tmp_path: Path) -> None:
    from agents.worker.commands.agent import _token_from_file

    token_file = tmp_path / "agent.token"
    token_file.write_text("d0a_secret\n")
    token_file.chmod(0o644)
    refused = subprocess.run([sys.executable, "-m", "day0cli", "agent", "--hardware", "cpu", "--portal",
                              f"http://127.0.0.1:{free_port()}", "--token-file", str(token_file)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "is readable by others (mode 644); chmod 600 it" in refused.stderr
    token_file.chmod(0o600)
    assert _token_from_file(token_file) == "d0a_secret"
