"""The job spec the portal sends and the agent reads (contract/jobspec.py): defaults for what an older portal
leaves out, unknown keys carried through, and every malformed key named."""

from __future__ import annotations

import pytest

from contract.jobspec import DEFAULT_DTYPE, JobSpec, JobSpecError, validate

PAYLOAD = {
    "stages": ["plan", "load"], "dtype": "bfloat16", "tp": 2, "pp": None, "ep": None,
    "thresholds": {"op_cosine": 0.999}, "bench": {"concurrency": [1, 4]}, "model_path": "/models/m",
    "job": 7, "attempt": 2, "nonce": "n" * 32, "purpose": "certify",
    "challenge": {"nonce": "n" * 32, "e2e": []},
    "model": {"slug": "m", "name": "M", "architecture": "LlamaForCausalLM", "config": {"architectures": ["X"]},
              "path": "/models/m"},
    "hardware": {"slug": "h100", "vendor": "nvidia", "name": "H100", "memory_bytes": 80 * 10**9, "memory_gb": 80.0,
                 "devices_per_node": 8, "intra_node_gbps": 450.0, "inter_node_gbps": None,
                 "memory_bandwidth_gbps": 3350.0, "dtypes": ["bfloat16"], "peak_tflops": {"bfloat16": 989.0},
                 "operator_manifest": []},
    "weight_probe": {"nonce": "n" * 32, "probes": []},
}


def test_a_portal_payload_reads_back_field_by_field_with_unknown_keys_kept() -> None:
    spec = JobSpec.from_dict(PAYLOAD)
    assert (spec.job, spec.attempt, spec.purpose, spec.stages, spec.dtype, spec.tp, spec.pp) == (
        7, 2, "certify", ["plan", "load"], "bfloat16", 2, None)
    assert spec.model["config"] == {"architectures": ["X"]} and spec.hardware["devices_per_node"] == 8
    assert spec.challenge == PAYLOAD["challenge"] and spec.weight_probe == PAYLOAD["weight_probe"]
    assert spec.reference_pool is None and spec.node is None
    assert spec.extra == {"model_path": "/models/m"}


def test_a_spec_from_an_older_portal_gets_the_defaults() -> None:
    spec = JobSpec.from_dict({"model": {"config": {}}})
    assert (spec.purpose, spec.dtype, spec.stages, spec.nonce, spec.thresholds, spec.bench) == (
        "certify", DEFAULT_DTYPE, None, None, {}, {})


@pytest.mark.parametrize(("change", "named"), [
    ({"model": ["m"]}, "model must be an object, got list"),
    ({"model": {"config": "{}"}}, "model.config must be an object, got str"),
    ({"hardware": {"memory_bytes": 1.5}}, "hardware.memory_bytes must be an integer, got float"),
    ({"hardware": {"devices_per_node": 0}}, "hardware.devices_per_node must be at least 1, got 0"),
    ({"hardware": {"dtypes": "bfloat16"}}, "hardware.dtypes must be a list, got str"),
    ({"tp": "2"}, "tp must be an integer, got str"),
    ({"ep": True}, "ep must be an integer, got bool"),
    ({"pp": 0}, "pp must be at least 1, got 0"),
    ({"stages": "plan"}, "stages must be a list of stage names"),
    ({"thresholds": {"op_cosine": "high"}}, "thresholds.op_cosine must be a number, got str"),
    ({"purpose": "bless"}, "purpose must be one of certify, reference, got 'bless'"),
    ({"weight_probe": ["model.safetensors"]}, "weight_probe must be an object, got list"),
    ({"node": 3}, "node must be an object, got int"),
    ({"attempt": "2"}, "attempt must be an integer, got str"),
])
def test_a_malformed_key_is_named(change: dict, named: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        validate({**PAYLOAD, **change})
    assert str(caught.value).startswith(named)
    assert caught.value.field == named.split(" ")[0]


def test_a_payload_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(JobSpecError, match="spec must be an object, got list"):
        JobSpec.from_dict([PAYLOAD])  # type: ignore[arg-type]
