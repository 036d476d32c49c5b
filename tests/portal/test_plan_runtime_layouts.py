"""The portal shows and accepts only layouts the runtime can run: a model the transformers fallback runs
(Qwen2.5-VL) is estimated on one device of a cell, says when that device is too small instead of proposing
tp 2, and a job pinning tp=2 on it is a 400 naming why (native models: tests/portal/test_job_layout_rules.py)."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from apps.matrix.models import Cell
from contract.hardware import find_config
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db


def _qwen_vl(org=None):
    return ModelReleaseFactory(slug="qwen2.5-vl-7b", config=find_config("qwen2.5-vl-7b"),
                               modalities=["text", "image"], **({"organization": org} if org else {}))


def test_a_fallback_models_cells_plan_one_device(api_client) -> None:
    big, small = HardwareFactory(memory_bytes=80 * 10**9), HardwareFactory(memory_bytes=16 * 10**9)
    model = _qwen_vl()
    fits = Cell.objects.get(model=model, hardware=big)
    assert fits.fits is True and fits.fits_devices == 1 and fits.fits_plan["plan"]["tp"] == 1
    assert fits.fits_plan["runtime"]["path"] == "fallback"
    short = Cell.objects.get(model=model, hardware=small)  # tp=2 would fit, but nothing runs it with tp=2
    assert short.fits is False and short.fits_devices is None and short.fits_plan["plan"]["devices"] == 1
    assert short.fits_plan["message"].startswith("does not fit one device: ")
    body = api_client.get(f"/api/v1/cells/{model.slug}/{small.slug}/").json()
    assert body["fits"]["plan"]["runtime"]["layouts"].endswith("runs on one device only (tp, pp and ep 1)")
    assert body["fits"]["fits"] is False and "does not fit one device" in body["fits"]["plan"]["message"]


def test_a_job_pinning_tp_2_on_a_fallback_model_is_a_400_naming_why(api_client) -> None:
    org = OrganizationFactory()
    model, hardware, token = _qwen_vl(org), HardwareFactory(), make_token(organization=org)
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, "tp": 2},
                               format="json", **auth(token))
    assert response.status_code == 400, response.content
    assert "tp=2 cannot run" in str(response.json()["tp"]) and "runs on one device only" in str(response.json()["tp"])
    assert Job.objects.count() == 0
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, "tp": 1},
                               format="json", **auth(token))
    assert response.status_code == 201, response.content
