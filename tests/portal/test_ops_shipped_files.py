"""The Prometheus and Grafana files docker/compose.yaml ships: rules that promtool accepts and whose alerts fire
as their unit tests say, a scrape config promtool accepts, and dashboards that query only what is exported."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import JobFactory

DOCKER = Path(__file__).resolve().parents[2] / "docker"
RULES = DOCKER / "prometheus" / "rules"
promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                              reason="promtool (Debian's prometheus package) not installed")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


@promtool
def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    checked = _run("check", "rules", str(RULES / "day0.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _run("test", "rules", str(DOCKER / "prometheus" / "tests" / "day0_test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr


@promtool
def test_promtool_accepts_the_scrape_config(tmp_path: Path) -> None:
    token = tmp_path / "metrics_token"
    token.write_text("t")
    config = (DOCKER / "prometheus" / "prometheus.yml").read_text()
    assert "/run/secrets/metrics_token" in config  # the compose secret
    (tmp_path / "prometheus.yml").write_text(config.replace("/run/secrets/metrics_token", str(token))
                                             .replace("/etc/prometheus/rules", str(RULES)))
    checked = _run("check", "config", str(tmp_path / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboards_are_grafana_json_on_the_provisioned_datasource() -> None:
    provisioned = (DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text()
    uid = re.search(r"uid:\s*(\S+)", provisioned).group(1)
    for path in (DOCKER / "grafana/dashboards").glob("*.json"):
        board = json.loads(path.read_text())
        source = next(v for v in board["templating"]["list"] if v["type"] == "datasource")
        assert source["current"]["value"] == uid, path.name
        assert board["panels"] and all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in board["panels"])


@pytest.mark.django_db
@override_settings(METRICS_TOKEN="token-for-the-names")
def test_the_portal_dashboard_and_rules_query_only_exported_names(client) -> None:
    JobFactory(state="queued")
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer token-for-the-names").content.decode()
    exported: set[str] = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + suffix for suffix in suffixes}
    queried = set(re.findall(r"\bday0_portal_[a-z_]+", (DOCKER / "grafana/dashboards/day0-portal.json").read_text()
                             + (RULES / "day0.yml").read_text()
                             + (DOCKER / "prometheus" / "tests" / "day0_test.yml").read_text()))
    assert "day0_portal_queue_depth" in queried and "day0_portal_agents_online" in queried
    assert queried <= exported, sorted(queried - exported)
