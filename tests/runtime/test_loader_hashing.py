"""The loader's shard hashing (``agents.runtime.loader.hashing``): the checksum cache, one digest per shard
whatever the number of threads, the digest of a mapping at every piece boundary, and the load copying on one
thread while the shards are hashed."""

from __future__ import annotations

import hashlib
import shutil
import struct
from pathlib import Path

import pytest
import torch

from agents.runtime.loader import LoadError, load_model
from agents.runtime.testing.make_model import cached_model
from tests.runtime.checkpoint_files import K_PROJ, replace_tensors, shard_of


@pytest.fixture(autouse=True)
def checksum_cache(tmp_path: Path, monkeypatch) -> Path:
    where = tmp_path / "sha256-cache.json"
    monkeypatch.setenv("DAY0_CHECKSUM_CACHE", str(where))
    return where


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(cached_model("llama"), dst)
    return dst


def test_checksum_cache_reuses_digests_only_for_unchanged_files(model_dir, checksum_cache):
    first = load_model(model_dir).report["shards"]
    assert {s["sha256_source"] for s in first} == {"computed"} and checksum_cache.exists()
    second = load_model(model_dir).report["shards"]
    assert {s["sha256_source"] for s in second} == {"cache"}
    assert [s["sha256"] for s in second] == [s["sha256"] for s in first]
    shard = shard_of(model_dir, K_PROJ)
    replace_tensors(shard, lambda t: t[K_PROJ].mul_(2))  # rewritten: new ctime, new bytes
    third = {s["file"]: s for s in load_model(model_dir).report["shards"]}
    assert third[shard.name]["sha256_source"] == "computed"
    assert third[shard.name]["sha256"] == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert load_model(model_dir, checksum_cache=False).report["shards"][0]["sha256_source"] == "computed"


def test_a_shard_corrupted_in_place_fails_the_manifest_naming_it_even_with_cached_digests(model_dir):
    """One flipped byte inside a tensor's data (the header stays valid, so the load itself succeeds): the shard
    is hashed again (the write changed its ctime, so the cached digest is not used) and fails the manifest."""
    clean = load_model(model_dir).report  # fills the checksum cache
    manifest = [{"name": s["file"], "size": s["size"], "sha256": s["sha256"]} for s in clean["shards"]]
    assert load_model(model_dir, manifest=manifest).report["ok"]
    shard = shard_of(model_dir, K_PROJ)
    (n,) = struct.unpack("<Q", shard.read_bytes()[:8])
    with open(shard, "r+b") as f:
        f.seek(8 + n + 5)
        byte = f.read(1)
        f.seek(8 + n + 5)
        f.write(bytes([byte[0] ^ 0x40]))
    report = load_model(model_dir, manifest=manifest).report
    assert not report["ok"]
    assert [p["file"] for p in report["problems"]] == [shard.name]
    assert "does not match the manifest" in report["problems"][0]["problem"]
    row = next(s for s in report["shards"] if s["file"] == shard.name)
    assert row["sha256_source"] == "computed" and not row["matches"]
    assert all(s["matches"] for s in report["shards"] if s["file"] != shard.name)


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_every_shard_is_hashed_once_whatever_the_number_of_hashing_threads(model_dir, workers):
    from agents.runtime.loader.hashing import ShardHasher

    files = sorted(model_dir.glob("*.safetensors"))
    hasher = ShardHasher(files, use_cache=False, workers=workers)
    digests = hasher.result()
    assert digests == {f.name: (hashlib.sha256(f.read_bytes()).hexdigest(), "computed") for f in files}
    assert hasher.computed_bytes == sum(f.stat().st_size for f in files) and hasher.seconds > 0


def test_the_load_copies_on_one_thread_only_while_shards_are_hashed(monkeypatch):
    from agents.runtime.loader import _one_thread_while

    class Hasher:
        busy = True

    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with pytest.raises(RuntimeError, match="a failed load"), _one_thread_while(Hasher()):
        assert calls == [1]
        raise RuntimeError("a failed load")
    assert calls == [1, 2]  # given back, even after a failure
    Hasher.busy = False
    calls.clear()
    with _one_thread_while(Hasher()):
        pass
    with _one_thread_while(None):
        pass
    assert calls == []
    with _one_thread_while(None, reading=True):  # shards read straight into parameters on the read threads
        assert calls == [1]
    assert calls == [1, 2]


def test_a_verifying_load_copies_on_one_thread_and_gives_the_threads_back_even_when_refused(model_dir, monkeypatch):
    import time

    import agents.runtime.loader as loader
    import agents.runtime.loader.hashing as hashing

    monkeypatch.setenv("DAY0_CHECKSUM_CACHE", "off")  # every shard hashed
    real_hash, real_adopt = hashing.sha256_file, loader.adopt_or_copy
    monkeypatch.setattr(hashing, "sha256_file", lambda path: (time.sleep(0.3), real_hash(path))[1])  # still busy
    seen: list[int] = []
    monkeypatch.setattr(loader, "adopt_or_copy", lambda p, t: (seen.append(torch.get_num_threads()), real_adopt(p, t)))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert load_model(model_dir).report["ok"]
        assert seen and set(seen) == {1}  # the merged gate/up parameters, adopted while the shards hashed
        assert torch.get_num_threads() == 2
        replace_tensors(shard_of(model_dir, K_PROJ), lambda t: t.update({K_PROJ: t[K_PROJ] * float("nan")}))
        with pytest.raises(LoadError, match="NaN"):
            load_model(model_dir, fail_on_nonfinite=True)  # refused inside the stream
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 65535, 65536, 65537, 3 * 65536 + 7])
def test_sha256_from_the_mapping_equals_hashlib_at_every_piece_boundary(tmp_path, monkeypatch, size):
    import agents.runtime.loader.hashing as hashing

    monkeypatch.setattr(hashing, "CHUNK", 65536)
    data = bytes((i * 131 + 7) % 256 for i in range(size))
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    assert hashing.sha256_file(path) == hashlib.sha256(data).hexdigest()
