"""Model configs: counts are integers within bounds, dtypes are dtype names, object keys are objects, and the fits
estimate of a model on every hardware stays fast whatever the layer count."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from apps.catalog.models import ModelRelease
from apps.catalog.services import do_update_hardware
from apps.matrix.models import Cell
from tests.factories import HardwareFactory, OrganizationFactory, auth, make_token, tiny_config

pytestmark = pytest.mark.django_db
CONFIGS = Path(__file__).resolve().parents[2] / "contract" / "data" / "configs"


def _post_model(api_client, token, config: dict[str, Any], slug: str = "m") -> Any:
    return api_client.post("/api/v1/models/", {"slug": slug, "name": slug, "config": config}, format="json",
                           **auth(token))


@pytest.mark.parametrize(("overrides", "names"), [
    ({"num_hidden_layers": 5000.0}, ["num_hidden_layers", "integer"]),
    ({"num_hidden_layers": 1e6}, ["num_hidden_layers", "4096"]),
    ({"num_hidden_layers": 22.0}, ["num_hidden_layers", "integer"]),  # integral, but counts are JSON integers
    ({"hidden_size": 10**12}, ["hidden_size", str(1 << 20)]),
    ({"hidden_size": 1e12}, ["hidden_size", str(1 << 20)]),
    ({"vocab_size": -1}, ["vocab_size", "0.."]),
    ({"num_attention_heads": True}, ["num_attention_heads", "integer"]),
    ({"torch_dtype": 5}, ["torch_dtype", "bfloat16"]),
    ({"torch_dtype": "fp99"}, ["torch_dtype"]),
    ({"dtype": ["bfloat16"]}, ["dtype"]),
    ({"rope_scaling": ["linear", 2.0]}, ["rope_scaling", "object"]),
    ({"rope_scaling": "yarn"}, ["rope_scaling", "object"]),
    ({"quantization_config": [1]}, ["quantization_config", "object"]),
    ({"architectures": "LlamaForCausalLM"}, ["architectures"]),
    ({"layer_types": "full_attention"}, ["layer_types"]),
    ({"text_config": {"hidden_size": 2.5}}, ["text_config.hidden_size"]),
    # each size within its bound, the product not: 4096 layers of 2^20 × 2^24 MLPs
    ({"num_hidden_layers": 4096, "hidden_size": 1 << 20, "intermediate_size": 1 << 24, "num_attention_heads": 1024,
      "num_key_value_heads": 1024}, ["parameters", "1e+15"]),
])
def test_bad_config_numbers_are_a_400_naming_the_key_and_nothing_is_stored(api_client, overrides, names) -> None:
    token = make_token(organization=OrganizationFactory())
    response = _post_model(api_client, token, tiny_config(**overrides))
    assert response.status_code == 400, response.content
    message = response.json()["config"][0]
    assert all(name in message for name in names), message
    assert not ModelRelease.objects.exists()


def test_a_bad_config_in_an_update_is_a_400_and_the_model_is_unchanged(api_client) -> None:
    token = make_token(organization=OrganizationFactory())
    assert _post_model(api_client, token, tiny_config()).status_code == 201
    response = api_client.patch("/api/v1/models/m/", {"config": tiny_config(num_hidden_layers=1e6)}, format="json",
                                **auth(token))
    assert response.status_code == 400 and "num_hidden_layers" in response.json()["config"][0]
    assert ModelRelease.objects.get(slug="m").config["num_hidden_layers"] == 22


def test_a_huge_but_allowed_layer_count_creates_and_plans_quickly(api_client) -> None:
    """4096 layers (the bound) of a DeepSeek-V3-shaped MoE on a dozen hardware: the fits estimate of every cell is
    computed in the request, and the per-model part of the plan once, not per hardware."""
    for i in range(12):
        HardwareFactory(memory_bytes=(16 + 16 * i) * 10**9, devices_per_node=(1, 4, 8, 72)[i % 4])
    config = dict(json.loads((CONFIGS / "deepseek-v3.json").read_text()), num_hidden_layers=4096)
    token = make_token(organization=OrganizationFactory())
    started = time.perf_counter()
    response = _post_model(api_client, token, config, slug="deep-4096")
    elapsed = time.perf_counter() - started
    assert response.status_code == 201, response.content
    assert elapsed < 2.0, f"creating a 4096-layer model took {elapsed:.2f} s"
    cells = Cell.objects.filter(model__slug="deep-4096")
    assert cells.count() == 12 and all(c.fits_error == "" and c.fits is not None and c.fits_plan for c in cells)
    hardware = cells.first().hardware
    started = time.perf_counter()  # a hardware edit re-plans its column (it once took 33 s after such a model)
    do_update_hardware(hardware, memory_bytes=hardware.memory_bytes * 2)
    assert time.perf_counter() - started < 1.0


def test_the_earlier_eight_minute_config_is_a_fast_400(api_client) -> None:
    """``num_hidden_layers: 1e6`` once held the database write lock for 8 minutes; now a 400 before any work."""
    HardwareFactory()
    token = make_token(organization=OrganizationFactory())
    started = time.perf_counter()
    response = _post_model(api_client, token, tiny_config(num_hidden_layers=1e6))
    assert response.status_code == 400 and time.perf_counter() - started < 1.0


def _plan_seconds(config: dict[str, Any], hardware: list[tuple[int, int]]) -> float:
    from contract.planner import plan_report

    started = time.perf_counter()
    for memory, per_node in hardware:
        plan_report(config, memory_bytes=memory, devices_per_node=per_node, dtype="bfloat16")
    return time.perf_counter() - started


@pytest.mark.django_db(False)
def test_planning_one_model_on_many_hardware_costs_the_same_at_64_and_4096_layers() -> None:
    """The per-hardware part of a plan does not grow with the layer count: parsing, counting and the per-layer
    bytes are done once per model, the search per hardware is O(candidates × stages)."""
    base = json.loads((CONFIGS / "deepseek-v3.json").read_text())
    hardware = [((16 + 8 * i) << 30, (1, 4, 8, 72)[i % 4]) for i in range(40)]
    small, large = dict(base, num_hidden_layers=64), dict(base, num_hidden_layers=4096)
    _plan_seconds(small, hardware[:1]), _plan_seconds(large, hardware[:1])  # the once-per-model part
    t_small = min(_plan_seconds(small, hardware) for _ in range(2))
    t_large = min(_plan_seconds(large, hardware) for _ in range(2))
    assert t_large < 2.5 * t_small + 0.05, f"64 layers: {t_small:.3f} s, 4096 layers: {t_large:.3f} s"
