"""The web process imports no torch and nothing of the agents: setting up Django and importing every portal
module (the ASGI and WSGI applications, the URL configuration, the Celery app and every module of every app,
migrations included) leaves torch, transformers and ``agents`` out of ``sys.modules`` (what it shares with the
agents comes from ``contract``). Runs in a fresh interpreter, so nothing the suite imported
before counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib, json, os, pkgutil, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")
import django
django.setup()
import apps
names = ["day0portal.asgi", "day0portal.wsgi", "day0portal.urls", "day0portal.celery"]
names += [m.name for m in pkgutil.walk_packages(apps.__path__, "apps.")]
heavy = ("torch", "transformers", "agents")
culprits = {h: "django.setup()" for h in heavy if h in sys.modules}
for name in names:
    before = {h for h in heavy if h in sys.modules}
    importlib.import_module(name)
    for h in heavy:
        if h in sys.modules and h not in before:
            culprits[h] = name
print(json.dumps({"imported": names, "loaded": sorted(h for h in heavy if h in sys.modules), "culprits": culprits}))
"""


def _probe() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_web_process_imports_no_torch_nor_transformers_nor_agents() -> None:
    result = _probe()
    # the walk really reached the portal: the entry points, every app's services, and the migrations
    assert {"day0portal.asgi", "day0portal.urls", "apps.catalog.services", "apps.jobs.api.views"} <= set(result["imported"])
    assert any(".migrations." in name for name in result["imported"])
    assert result["loaded"] == [], f"the web process imported {result['loaded']} (first through {result['culprits']})"
