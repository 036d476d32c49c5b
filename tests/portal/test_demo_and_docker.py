"""`day0 demo` from the command line, and docker/.env.example against the settings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tests.live_services import free_port, start_demo

ROOT = Path(__file__).resolve().parents[2]


# set by the project for its own processes or test runs (`day0 agent` passes --portal to its worker as
# DAY0_AGENT_PORTAL), or prefixes the agent strips from its environment; never set by an operator
# set by the runtime for its own ranks, or fault injection for tests: not for operators
INTERNAL_VARIABLES = {"DAY0_AGENT_ID", "DAY0_TEST_MODELS_DIR", "DAY0_AGENT_PORTAL", "DAY0_DATABASE", "DAY0_SECRET",
                      "DAY0_TP_ERROR_DIR", "DAY0_INJECT_RANK_FAULT"}


def test_env_example_lists_every_variable_the_code_reads() -> None:
    read: set[str] = set()
    for folder in ("day0portal", "apps", "agents", "contract"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r'"(DAY0_[A-Z0-9_]*[A-Z0-9])"', path.read_text()))
    read = {name for name in read if not name.endswith("_")} - INTERNAL_VARIABLES
    listed = set(re.findall(r"^(DAY0_[A-Z0-9_]+)=", (ROOT / "docker" / ".env.example").read_text(), re.M))
    assert "DAY0_DATABASE_URL" in read and read <= listed, sorted(read - listed)


def test_day0_demo_serves_the_seed_catalog_on_the_embedded_default(tmp_path) -> None:
    process, lines = start_demo(tmp_path, "--no-agent", until="Ctrl-C stops it", timeout=120)
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", "".join(lines)).group(1))
    try:
        output = "".join(lines)
        assert f"http://127.0.0.1:{port}/" in output, output
        token = re.search(r"API token\s+(\S+)", output).group(1)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/matrix/",
                                         headers={"Authorization": f"Token {token}"})
        matrix = json.load(urllib.request.urlopen(request, timeout=10))
        assert len(matrix["models"]) >= 8 and len(matrix["hardware"]) >= 8
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        assert "Compatibility matrix" in page and "deepseek-v3" in page.lower()
        assert (tmp_path / "day0.sqlite3").exists()
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_day0_demo_adapts_a_tiny_moe_end_to_end_and_prints_the_tier(tmp_path) -> None:
    """The README's first command: portal, portal worker and a CPU agent on the embedded default; the tiny MoE
    job goes through every default stage and the cell ends baselined."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAY0_") or k == "DAY0_TEST_MODELS_DIR"}
    result = subprocess.run([sys.executable, "-m", "day0cli", "demo", "--port", str(free_port()),
                             "--data-dir", str(tmp_path), "--exit-when-done", "--no-real-model"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=360)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    for stage in ("plan", "load", "inventory", "align", "serve", "bench", "env"):
        assert re.search(rf"\[\s*{stage}\] {stage} passed", output), (stage, output[-4000:])
    assert re.search(r"cells/tiny-qwen3-moe/cpu/ -> tier 5 \(baselined\)", output), output[-4000:]


def test_compose_runs_the_production_stack_from_the_dockerfiles() -> None:
    """No Docker engine here: the compose file and Dockerfiles are checked for what they must wire up."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "rabbitmq", "web", "worker", "agent", "runtime", "prometheus",
                             "grafana"}
    commands = {}
    for name in ("web", "worker", "agent"):
        dockerfile = ROOT / services[name]["build"]["dockerfile"]
        commands[name] = next(line for line in dockerfile.read_text().splitlines() if line.startswith("CMD"))
    assert "uvicorn day0portal.asgi:application" in commands["web"]
    assert "celery -A day0portal worker -B" in commands["worker"]  # beat: lost-job detection runs somewhere
    assert "day0 agent" in commands["agent"]
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["day0"]
    package = script.split(".")[0]  # the image installs `day0` from this package: it must be copied in
    assert f"COPY {package} ./{package}" in (ROOT / services["agent"]["build"]["dockerfile"]).read_text(), package
    for flag in re.findall(r"(--[a-z-]+)", commands["agent"]):  # every flag the image passes exists
        assert flag in subprocess.run([sys.executable, "-m", "day0cli", "agent", "--help"], cwd=ROOT,
                                      capture_output=True, text=True).stdout, flag
    for name in ("web", "worker"):
        env = services[name]["environment"]
        assert env["DAY0_DATABASE_URL"].startswith("postgres://")
        assert env["DAY0_REDIS_URL"].startswith("redis://:${REDIS_PASSWORD}@redis:")  # the cache has a password
        assert env["DAY0_BROKER_URL"].startswith("amqp://day0:${RABBITMQ_PASSWORD}@rabbitmq:5672/")
    assert "--requirepass" in " ".join(services["redis"]["command"])


def test_the_compose_agent_holds_its_own_broker_user_and_nothing_of_the_portals() -> None:
    """Trust boundaries: the agent gets the portal URL, its token and its own broker URL; no database, no Redis,
    no broker admin, no .env file (which holds the portal's secrets)."""
    import yaml

    agent = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]["agent"]
    env = agent.get("environment", {})
    assert "env_file" not in agent
    assert set(env) <= {"DAY0_PORTAL_URL", "DAY0_AGENT_BROKER", "DAY0_AGENT_HARDWARE", "DAY0_AGENT_HOSTNAME",
                        "DAY0_AGENT_TOKEN"}, sorted(env)
    assert env["DAY0_AGENT_BROKER"] == "${DAY0_AGENT_BROKER:-}"  # as `manage.py broker_user` printed it
    values = " ".join(str(v) for v in env.values())
    for secret in ("redis", "postgres", "REDIS_PASSWORD", "RABBITMQ_PASSWORD", "15672"):
        assert secret not in values, secret
    dockerfile = (ROOT / "docker" / "Dockerfile.agent").read_text()
    assert "--broker" not in next(line for line in dockerfile.splitlines() if line.startswith("CMD"))  # not in ps
    example = (ROOT / "docker" / ".env.example").read_text()
    assert re.search(r"^DAY0_AGENT_BROKER=$", example, re.M) and re.search(r"^DAY0_BROKER_URL=$", example, re.M)


def test_every_image_copies_every_package_it_installs() -> None:
    """``pip install`` in an image installs the packages pyproject.toml finds; each must be copied in first (the
    portal, the portal's worker and the agent all import ``contract``)."""
    import tomllib

    packages = [p.rstrip("*") for p in
                tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert "contract" in packages
    for name in ("Dockerfile.portal", "Dockerfile.worker", "Dockerfile.agent"):
        copied = re.findall(r"^COPY (\S+) \./\1$", (ROOT / "docker" / name).read_text(), re.M)
        assert set(packages) <= set(copied), (name, sorted(set(packages) - set(copied)))
