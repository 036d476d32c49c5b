"""Shards read straight into their place in a parameter (``loader/direct.py``): the stacked experts and merged
q/k/v hold exactly the checkpoint's bytes, as the streamed copy made them; experts loaded as panels equal the
panels packed after loading; a short read and a non-finite expert are refused naming the file and tensor."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import agents.runtime.loader as loader
from agents.runtime import kernels
from agents.runtime.loader import LoadError, load_model
from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.direct import direct_reads, read_into
from agents.runtime.loader.safetensors_file import TensorEntry
from agents.runtime.testing.make_model import cached_model
from tests.runtime.checkpoint_files import replace_tensors, shard_of

EXPERT = "model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"


@pytest.fixture(autouse=True)
def checksum_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DAY0_CHECKSUM_CACHE", str(tmp_path / "sha256-cache.json"))


@pytest.fixture()
def moe_dir(tmp_path: Path) -> Path:
    dst = tmp_path / "mixtral"
    shutil.copytree(cached_model("mixtral"), dst)
    return dst


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8)


def _same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        assert pa[name].shape == pb[name].shape, name
        assert torch.equal(_bits(pa[name]), _bits(pb[name])), name


def test_expert_and_qkv_shards_are_read_straight_into_place_holding_the_checkpoint_bytes(moe_dir, monkeypatch):
    result = load_model(moe_dir)
    model, report = result.model, result.report
    assert report["ok"]
    ckpt = Checkpoint.open(moe_dir)
    direct = {entry.name for entry, _ in direct_reads(model, ckpt, set(), lambda name: False)}
    experts = model.model.layers[0].mlp.experts
    inter = experts.inter
    for e in range(experts.num_experts):
        assert {EXPERT.format(e=e, w=w) for w in ("w1", "w2", "w3")} <= direct
        files = {w: load_file(shard_of(moe_dir, EXPERT.format(e=e, w=w)))[EXPERT.format(e=e, w=w)]
                 for w in ("w1", "w2", "w3")}
        assert torch.equal(_bits(experts.w13[e, :inter]), _bits(files["w1"]))
        assert torch.equal(_bits(experts.w13[e, inter:]), _bits(files["w3"]))
        assert torch.equal(_bits(experts.w2[e]), _bits(files["w2"]))
    assert {f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"} <= direct
    assert set(report["stats"]) == set(ckpt.tensors)  # statistics for the tensors read straight too

    monkeypatch.setattr(loader, "direct_reads", lambda *args: [])  # every tensor through the stream, as before
    streamed = load_model(moe_dir)
    _same_parameters(model, streamed.model)
    assert set(streamed.report["stats"]) == set(report["stats"])


def test_experts_packed_while_loading_equal_the_panels_packed_after_the_load(moe_dir):
    if not kernels.available():
        pytest.skip(f"native kernels unavailable: {kernels.status()['reason']}")
    packed = load_model(moe_dir, pack_weights=True)
    plain = load_model(moe_dir)
    assert plain.report["packed_weights"] is None
    count = plain.model.pack_weights()
    assert packed.report["ok"] and packed.report["packed_weights"] == count > 0
    for layer in packed.model.model.layers:
        assert layer.mlp.experts.panels
    _same_parameters(packed.model, plain.model)
    name = EXPERT.format(e=2, w="w3")  # once loaded, packed experts refuse a reload as after pack_weights
    with pytest.raises(RuntimeError, match="is packed"):
        packed.model.load_weights(iter([(name, torch.zeros_like(load_file(shard_of(moe_dir, name))[name]))]))


@pytest.mark.parametrize("pack", [False, True])
def test_a_nonfinite_expert_weight_is_reported_and_fatal_on_request(moe_dir, pack):
    if pack and not kernels.available():
        pytest.skip("native kernels unavailable")
    name = EXPERT.format(e=1, w="w2")
    shard = shard_of(moe_dir, name)

    def poison(t: dict) -> None:
        t[name][2, :4] = float("nan")

    replace_tensors(shard, poison)
    report = load_model(moe_dir, pack_weights=pack).report
    assert not report["ok"]
    assert report["problems"] == [{"tensor": name, "file": shard.name, "problem": "4 NaN and 0 Inf values"}]
    assert report["stats"][name]["nan"] == 4
    with pytest.raises(LoadError, match=f"{shard.name}: tensor '{name}' has 4 NaN"):
        load_model(moe_dir, pack_weights=pack, fail_on_nonfinite=True)


def test_a_file_shorter_than_the_tensor_is_a_load_error_naming_both(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\0" * 100)
    entry = TensorEntry("w", path, "F32", (40,), 0, 160)
    dest = torch.empty(40)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(LoadError, match="short.safetensors: tensor 'w': the file ends 60 bytes short"):
            read_into(fd, entry, dest)
    finally:
        os.close(fd)
