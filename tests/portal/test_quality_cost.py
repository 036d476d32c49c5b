"""A quantised release linked to its unquantised original (``quantized_from``): the cell shows the format and
whether it runs native or emulated there, and a "quality cost" row per task, the eval delta against the
original's eval with its 95 % bound; the link is set through the API and refused when it cannot hold."""

from __future__ import annotations

import re

import pytest

from apps.evidence.services import do_record_stage_results
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, auth, make_token, tiny_config
from tests.portal.reports import passing

pytestmark = pytest.mark.django_db
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}


def _eval(arith: float, qa: float) -> dict:
    section = passing("eval")
    section["tasks"] = [
        {"task": "arith", "metric": "accuracy", "reference": arith, "target": arith, "n": 200, "wilson_low": 0.5,
         "passed": True},
        {"task": "qa", "metric": "exact_match", "reference": qa, "target": qa, "n": 100, "wilson_low": 0.5,
         "passed": True},
        {"task": "wikitext", "metric": "perplexity", "reference": 12.0, "target": 12.0 + (0.9 - arith) * 10, "n": 50,
         "wilson_low": None, "passed": True, "higher_is_better": False}]
    return section


def _text(html: str, element_id: str, tag: str = "(?:p|span)") -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</{tag}>', html, re.S)
    assert match, element_id
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", match.group(1)))


def test_the_cell_shows_the_quality_cost_against_the_original(client) -> None:
    hardware = HardwareFactory(dtypes=["bfloat16"])
    original = ModelReleaseFactory(slug="tiny-llama")
    quantised = ModelReleaseFactory(slug="tiny-llama-gptq", organization=original.organization,
                                    config=tiny_config(quantization_config=GPTQ), quantized_from=original)
    do_record_stage_results(JobFactory(model=original, hardware=hardware), {"eval": _eval(0.90, 0.80)})
    job = JobFactory(model=quantised, hardware=hardware)
    plan = passing("plan")
    plan["quant"] = {"format": "int4-g32", "bytes": 1000, "mode": "emulated", "how": "dequantized at load",
                     "runtime_bytes": 4000}
    do_record_stage_results(job, {"plan": plan, "eval": _eval(0.60, 0.79)})
    html = client.get(f"/cells/{quantised.slug}/{hardware.slug}/").content.decode()
    fmt = _text(html, "quant-format")
    assert "int4-g32" in fmt and "emulated" in fmt and "plan stage" in fmt
    table = _text(html, "quality-cost", "table")
    rows = dict(re.findall(r'<tr data-task="(\w+)"( class="failed")?', html.split('id="quality-cost"')[1]))
    assert rows == {"arith": ' class="failed"', "qa": "", "wikitext": ""}
    assert "-0.3000" in table and "worse beyond the bound" in table  # 0.60 vs 0.90 of 200: beyond the bound
    assert "lower, within the bound" in table  # 0.79 vs 0.80 of 100
    assert 'href="/models/tiny-llama/"' in html  # the original, linked


def test_without_the_originals_eval_the_row_says_what_is_missing(client) -> None:
    hardware = HardwareFactory()
    original = ModelReleaseFactory()
    quantised = ModelReleaseFactory(config=tiny_config(quantization_config=GPTQ), quantized_from=original,
                                    organization=original.organization)
    do_record_stage_results(JobFactory(model=quantised, hardware=hardware), {"eval": _eval(0.6, 0.7)})
    html = client.get(f"/cells/{quantised.slug}/{hardware.slug}/").content.decode()
    assert "the original has no eval" in _text(html, "quality-cost-missing")
    plain = client.get(f"/cells/{original.slug}/{hardware.slug}/").content.decode()
    assert 'id="quantization"' not in plain  # an unquantised release without a variant's link shows nothing


def test_the_link_is_set_through_the_api_and_refused_when_it_cannot_hold(client) -> None:
    original = ModelReleaseFactory(slug="orig")
    quantised = ModelReleaseFactory(slug="orig-gptq", organization=original.organization,
                                    config=tiny_config(quantization_config=GPTQ))
    token = make_token(organization=original.organization, scopes=["read", "submit"])
    url = f"/api/v1/models/{quantised.slug}/"
    response = client.patch(url, {"quantized_from": "orig"}, content_type="application/json", **auth(token))
    assert response.status_code == 200 and response.json()["quantized_from"] == "orig"
    quantised.refresh_from_db()
    assert quantised.quantized_from_id == original.pk
    for value, message in (("orig-gptq", "itself"), ("nope", "does not exist")):
        response = client.patch(url, {"quantized_from": value}, content_type="application/json", **auth(token))
        assert response.status_code == 400 and message in str(response.json()["quantized_from"])
    other = ModelReleaseFactory(config=tiny_config(quantization_config=GPTQ))  # a quantised release elsewhere
    response = client.patch(f"/api/v1/models/{original.slug}/", {"quantized_from": other.slug},
                            content_type="application/json", **auth(token))
    assert response.status_code == 400 and "itself quantised" in str(response.json()["quantized_from"])


def test_the_matrix_says_why_a_declared_format_runs_emulated() -> None:
    """A B200 declares FP4, but the runtime has no native FP4 matmul: the fit estimate says emulated with the
    reason, and the cell's hover text carries it (contract ``quant_block``, ``matrix/presenters.cell_title``)."""
    from apps.matrix.models import Cell
    from apps.matrix.presenters import cell_title
    from apps.matrix.selectors import CellView

    fp4 = HardwareFactory(dtypes=["bfloat16", "float8_e4m3fn", "float4_e2m1fn"])
    release = ModelReleaseFactory(config=tiny_config(quantization_config={"quant_method": "mxfp4"}))
    fp8 = ModelReleaseFactory(config=tiny_config(quantization_config={
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}))
    quant = Cell.objects.get(model=release, hardware=fp4).fits_plan["quant"]
    assert quant["mode"] == "emulated" and quant["reason"] == (
        "FP4 (mxfp4): no native FP4 matmul in the runtime; dequantized at load")
    assert Cell.objects.get(model=fp8, hardware=fp4).fits_plan["quant"]["mode"] == "native"
    view = CellView(0, "", True, 1, None, 0, fits_dtype="mxfp4", quant_mode=quant["mode"], quant_reason=quant["reason"])
    assert "(emulated on this hardware: FP4 (mxfp4): no native FP4 matmul in the runtime" in cell_title(
        view, fp4.name, None, [])
