"""The embedded default (SQLite, filesystem broker, in-memory layer) runs the same code: event ingest and
result ingest through the API, in a separate process whose settings have no server URLs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, django
    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment
    setup_test_environment()
    call_command("migrate", verbosity=0)
    from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, make_token
    from tests.portal.reports import passing
    hw = HardwareFactory(); job = JobFactory(hardware=hw)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hw)
    c, h = Client(), {"HTTP_AUTHORIZATION": "Token " + token.secret}
    def post(seqs):
        body = [{"seq": s, "ts": "2026-01-01T00:00:00Z", "kind": "log", "message": "m%d" % s} for s in seqs]
        return c.post("/api/v1/jobs/%d/events/" % job.pk, json.dumps(body), content_type="application/json", **h).json()
    acks = [post([1, 2]), post([4]), post([2, 3])]
    r = c.post("/api/v1/jobs/%d/results/" % job.pk, json.dumps({"stages": {"plan": passing("plan"),
               "load": passing("load")}, "attempt": job.attempts, "nonce": job.nonce}), content_type="application/json", **h)
    ready = c.get("/readyz").json()
    print(json.dumps({"vendor": connection.vendor, "acks": [a["acked"] for a in acks],
                      "tier": r.json()["cell"]["tier"], "ready": ready["status"]}))
''')


def test_ingest_on_sqlite_with_the_filesystem_broker(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAY0_")}
    env.update(DAY0_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="day0portal.settings",
               PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert result == {"vendor": "sqlite", "acks": [2, 2, 4], "tier": 2, "ready": "ok"}
