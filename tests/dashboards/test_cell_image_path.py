"""The cell page's image-path card for a release that takes images: the serve stage's image checks and the
align stage's vision rows, from sections in the shape the stages write, recorded by the portal's own service;
a text-only release shows no such card."""

from __future__ import annotations

import pytest

from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory

pytestmark = pytest.mark.django_db

SERVE = {"ready_seconds": 2.5, "endpoint": "http://127.0.0.1:8000", "text_path_ok": True, "chat_path_ok": True,
         "image_path_ok": True, "checks": [
             {"name": "completions", "ok": True, "detail": "x"},
             {"name": "image_chat", "ok": True, "detail": "41 prompt tokens; 'a cat'"},
             {"name": "image_chat_stream", "ok": True, "detail": "9 deltas"}]}
VISION = {"passed": False, "rows": [
    {"part": "vision_encoder", "image": 0, "cosine": 0.99999, "rel_err": 0.0004, "passed": True},
    {"part": "projector", "image": 0, "cosine": 0.97, "rel_err": 0.2, "passed": False}],
    "e2e": [{"prompt": "Describe this picture.", "image": 0, "reference": [5, 6, 7], "target": [5, 6, 7],
             "match": True}]}


def _card(html: str) -> str:
    card = html[html.index('id="image-path"'):]
    return card[: card.index("</section>")]


def test_the_cell_page_shows_the_image_path_evidence(client_for) -> None:
    from apps.evidence.services import do_record_stage_results

    model, hardware = ModelReleaseFactory(modalities=["text", "image"]), HardwareFactory()
    url = f"/cells/{model.slug}/{hardware.slug}/"
    job = JobFactory(model=model, hardware=hardware)
    do_record_stage_results(job, {"serve": SERVE})
    card = _card(client_for(None).get(url).content.decode())
    assert "✓ answered" in card and f"#{job.pk}" in card
    assert "image_chat: 41 prompt tokens" in card and "image_chat_stream" in card and "completions:" not in card
    assert "Vision encoder" not in card  # no align section yet
    later = JobFactory(model=model, hardware=hardware)
    do_record_stage_results(later, {"serve": {**SERVE, "image_path_ok": False}, "align": {"vision": VISION}})
    card = _card(client_for(None).get(url).content.decode())
    assert "✗ failed" in card and "projector" in card and "0.97" in card
    assert "Describe this picture. (image 0): all 3 tokens equal" in card


def test_a_text_only_release_has_no_image_path_card(client_for) -> None:
    model, hardware = ModelReleaseFactory(modalities=["text"]), HardwareFactory()
    html = client_for(None).get(f"/cells/{model.slug}/{hardware.slug}/").content.decode()
    assert 'id="image-path"' not in html
