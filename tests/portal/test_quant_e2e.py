"""The align section's ``e2e_original`` block (a quantised release end to end against its unquantised original) on
the portal: stored with the section, shown on the cell's quality-cost card beside the eval delta, informational
(the align verdict is the same without it), and refused whole, naming the value, when out of its bounds."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ValidationError

from apps.evidence.models import StageResult
from apps.evidence.services import do_record_stage_results
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, tiny_config
from tests.portal.reports import passing

pytestmark = pytest.mark.django_db
INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
# shaped as agents/pipeline/stages/align/original.py reports an int4-ct tiny release against its original
BLOCK = {"method": "original (transformers fp32) greedy decode; the quantised target scored on the same prefixes",
         "original": "original", "informational": True, "prompts": 3, "tokens": 48, "top_k": 10,
         "token_match_rate": 0.875, "exact": False, "first_divergence": [4, None, 11], "kl_mean": 0.00213,
         "kl_max": 0.0101, "topk_kl_mean": 0.00031, "topk_kl_max": 0.0022, "perplexity_original": 533.59,
         "perplexity_target": 536.02, "perplexity_rel_diff": 0.00455}


def _job():
    model = ModelReleaseFactory(config=tiny_config(quantization_config=INT4))
    return JobFactory(model=model, hardware=HardwareFactory())


def test_the_cell_shows_the_end_to_end_cost_beside_the_eval_delta(client) -> None:
    job = _job()
    align = passing("align")
    plain = do_record_stage_results(job, {"align": align})[0]
    stored = do_record_stage_results(job, {"align": {**align, "e2e_original": BLOCK}})[0]
    assert (stored.verdict, stored.reasons) == (plain.verdict, plain.reasons)  # informational
    assert StageResult.objects.get(pk=stored.pk).section["e2e_original"]["token_match_rate"] == 0.875
    html = client.get(f"/cells/{job.model.slug}/{job.hardware.slug}/").content.decode()
    assert 'id="quantization"' in html
    table = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.split('id="quant-e2e"')[1].split("</table>")[0]))
    assert "0.8750" in table and "48 in 3 prompts" in table and "0.00213 / 0.0101" in table
    assert "533.6" in table and "536" in table and "+0.0046" in table and "exact" not in table
    assert "informational: it does not fail align" in html and f"/jobs/{job.pk}/" in html


def test_an_exact_control_says_so_and_an_error_is_shown(client) -> None:
    job = _job()
    exact = {**BLOCK, "token_match_rate": 1.0, "exact": True, "kl_mean": 0.0, "kl_max": 1e-9,
             "first_divergence": [None, None, None]}
    do_record_stage_results(job, {"align": {**passing("align"), "e2e_original": exact}})
    html = client.get(f"/cells/{job.model.slug}/{job.hardware.slug}/").content.decode()
    assert "exact" in re.sub(r"<[^>]+>", " ", html.split('id="quant-e2e-match"')[1].split("</td>")[0])
    failed = {"method": BLOCK["method"], "original": "/data/orig", "informational": True,
              "error": "ValueError: /data/orig has vocab_size 10, the release 256: not the same tokenizer"}
    do_record_stage_results(job, {"align": {**passing("align"), "e2e_original": failed}})
    html = client.get(f"/cells/{job.model.slug}/{job.hardware.slug}/").content.decode()
    assert "not the same tokenizer" in html.split('id="quant-e2e-error"')[1] and 'id="quant-e2e"' not in html


@pytest.mark.parametrize(("bad", "where"), [
    ({"token_match_rate": 1.4}, "stages.align.e2e_original.token_match_rate"),
    ({"kl_mean": -0.2}, "stages.align.e2e_original.kl_mean"),
    ({"tokens": "many"}, "stages.align.e2e_original.tokens"),
    ({"first_divergence": [-3]}, "stages.align.e2e_original.first_divergence"),
    ({"original": "x" * 2000}, "stages.align.e2e_original.original"),
])
def test_a_block_out_of_bounds_is_refused_naming_the_value(bad: dict, where: str) -> None:
    with pytest.raises(ValidationError) as err:
        do_record_stage_results(_job(), {"align": {**passing("align"), "e2e_original": {**BLOCK, **bad}}})
    assert where in str(err.value), err.value
    assert StageResult.objects.count() == 0


def test_a_block_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValidationError) as err:
        do_record_stage_results(_job(), {"align": {**passing("align"), "e2e_original": [1, 2]}})
    assert "stages.align.e2e_original" in str(err.value) and "object" in str(err.value)
