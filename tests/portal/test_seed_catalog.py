"""The seed catalog: real public configs and accelerators, computed parameter counts within 2 % of the published
totals, and a fits estimate on every cell before any job ran."""

from __future__ import annotations

import pytest

from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.seed import ensure_demo_admin, seed_catalog
from apps.matrix.models import Cell

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded() -> None:
    seed_catalog()


def test_seed_is_idempotent(seeded) -> None:
    again = seed_catalog()
    assert again.created == [] and again.updated == []
    assert ModelRelease.objects.count() >= 8 and Hardware.objects.exclude(slug="cpu").count() >= 8
    assert Cell.objects.count() == ModelRelease.objects.count() * Hardware.objects.count()


def test_computed_totals_are_within_two_percent_of_published(seeded) -> None:
    for model in ModelRelease.objects.exclude(published_params_total=None):
        ratio = model.params_total / model.published_params_total
        assert 0.98 <= ratio <= 1.02, (model.slug, model.params_total, model.published_params_total)
        # (active counts are not compared: publishers differ on whether embeddings count as active)
        assert model.params_active <= model.params_total


def test_every_accelerator_cell_has_a_physically_sound_fits_estimate(seeded) -> None:
    cells = Cell.objects.select_related("model", "hardware").exclude(hardware__slug="cpu")
    for cell in cells:
        if cell.fits is False and cell.fits_plan["runtime"]["path"] == "fallback":  # gpt-oss-120b on a 64 GB device:
            assert cell.fits_plan["plan"]["devices"] == 1  # only one device runs it, so no larger plan is proposed
            assert cell.fits_plan["message"].startswith("does not fit one device: "), cell.fits_plan["message"]
            continue
        assert cell.fits is True, (cell.model.slug, cell.hardware.slug, cell.fits_error)
        weights = cell.fits_plan["weight_bytes"]
        assert cell.fits_devices * cell.hardware.memory_bytes >= weights, (cell.model.slug, cell.hardware.slug)
        assert cell.fits_devices == cell.fits_plan["plan"]["devices"]
    big = Cell.objects.get(model__slug="llama-3.1-405b", hardware__slug="nvidia-h100-sxm")
    small = Cell.objects.get(model__slug="llama-3.1-8b", hardware__slug="nvidia-h100-sxm")
    assert small.fits_devices == 1 and big.fits_devices > 8  # 810 GB of bf16 weights on 80 GB devices


def test_demo_admin_is_an_admin_of_the_demo_organization(seeded) -> None:
    user, password = ensure_demo_admin("admin", "a-long-demo-password")
    assert user.is_superuser and user.check_password("a-long-demo-password")
    assert user.memberships.get().role == "admin"
    _, unchanged = ensure_demo_admin("admin")
    assert unchanged is None
