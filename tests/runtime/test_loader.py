"""The strict loader: every refusal names the file and the tensor; reports checksums, stats and NaN/Inf."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agents.runtime.loader import LoadError, load_model
from agents.runtime.testing.make_model import cached_model
from tests.runtime.checkpoint_files import (
    EMBED,
    K_PROJ,
    header_names,
    index,
    replace_tensors,
    rewrite_header,
    set_index,
    shard_of,
)


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


def _refused(d: Path, *parts: str, **kw) -> str:
    with pytest.raises(LoadError) as err:
        load_model(d, **kw)
    for part in parts:
        assert part in str(err.value), str(err.value)
    return str(err.value)



def test_clean_load_reports_checksums_stats_and_rate(model_dir):
    result = load_model(model_dir)
    report = result.report
    assert report["ok"] and report["path"] == "native" and report["problems"] == []
    files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    assert [s["file"] for s in report["shards"]] == files
    for shard in report["shards"]:
        assert shard["sha256"] == hashlib.sha256((model_dir / shard["file"]).read_bytes()).hexdigest()
    embed = load_file(shard_of(model_dir, EMBED))[EMBED]
    st = report["stats"][EMBED]
    assert st["mean"] == pytest.approx(embed.mean().item(), abs=1e-6)
    assert st["absmax"] == pytest.approx(embed.abs().max().item())
    assert st["nan"] == st["inf"] == 0
    assert report["tensors"] == len(report["stats"]) and report["bytes"] > 0 and report["gb_per_s"] > 0
    assert report["peak_rss_bytes"] > 0
    torch.testing.assert_close(result.model.model.embed_tokens.weight, embed)


def test_zero_copy_parameters_survive_the_files_being_removed(model_dir):
    result = load_model(model_dir)
    assert result.report["zero_copy_bytes"] > 0
    embed = load_file(shard_of(model_dir, EMBED))[EMBED]
    copied = load_model(model_dir, zero_copy=False)
    assert copied.report["zero_copy_bytes"] == 0
    shutil.rmtree(model_dir)
    torch.testing.assert_close(result.model.model.embed_tokens.weight, embed)
    torch.testing.assert_close(copied.model.model.embed_tokens.weight, embed)
    result.model.model.embed_tokens.weight.data.mul_(2)  # a private mapping: writable, never written back
    torch.testing.assert_close(result.model.model.embed_tokens.weight, embed * 2)


def test_progress_is_called_up_to_the_total(model_dir):
    calls = []
    load_model(model_dir, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1][0] == calls[-1][1] == len(index(model_dir)["weight_map"])


def test_single_file_checkpoint_loads(model_dir):
    tensors = {}
    for shard in sorted(model_dir.glob("model-*.safetensors")):
        tensors.update(load_file(shard))
        shard.unlink()
    (model_dir / "model.safetensors.index.json").unlink()
    save_file(tensors, model_dir / "model.safetensors")
    assert load_model(model_dir).report["shards"][0]["file"] == "model.safetensors"


def test_truncated_shard_is_refused(model_dir):
    shard = shard_of(model_dir, EMBED)
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    message = _refused(model_dir, shard.name, "truncated")
    last = max(header_names(shard), key=lambda item: item[1])[0]  # the tensor whose bytes were cut
    assert repr(last) in message


def test_header_ranges_past_the_file_are_refused(model_dir):
    shard = shard_of(model_dir, K_PROJ)
    rewrite_header(shard, lambda h: h[K_PROJ].update(data_offsets=[h[K_PROJ]["data_offsets"][0], 10**9]))
    _refused(model_dir, shard.name, K_PROJ, "past the end")


def test_overlapping_header_ranges_are_refused(model_dir):
    shard = shard_of(model_dir, K_PROJ)

    def overlap(h: dict) -> None:
        ordered = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        assert len(ordered) > 1, "the shard needs a second tensor for this test"
        later = ordered[1]
        begin, end = h[later]["data_offsets"]
        h[later]["data_offsets"] = [begin - 4, end - 4]  # same size, now 4 bytes into the previous tensor

    rewrite_header(shard, overlap)
    _refused(model_dir, shard.name, "overlap")


def test_wrong_shape_is_refused(model_dir):
    shard = shard_of(model_dir, K_PROJ)
    replace_tensors(shard, lambda t: t.update({K_PROJ: torch.zeros(t[K_PROJ].shape[0] + 1, t[K_PROJ].shape[1])}))
    _refused(model_dir, shard.name, K_PROJ, "shape")


def test_wrong_dtype_is_refused(model_dir):
    shard = shard_of(model_dir, K_PROJ)
    replace_tensors(shard, lambda t: t.update({K_PROJ: t[K_PROJ].half()}))
    _refused(model_dir, shard.name, K_PROJ, "dtype F16")


def test_missing_tensor_is_refused(model_dir):
    shard = shard_of(model_dir, K_PROJ)
    replace_tensors(shard, lambda t: t.pop(K_PROJ))
    set_index(model_dir, lambda m: m.pop(K_PROJ))
    _refused(model_dir, "model.safetensors.index.json", "missing tensor", K_PROJ)


def test_extra_tensor_is_refused(model_dir):
    shard = shard_of(model_dir, K_PROJ)
    extra = "model.layers.0.self_attn.extra_proj.weight"
    replace_tensors(shard, lambda t: t.update({extra: torch.zeros(2, 2)}))
    set_index(model_dir, lambda m: m.update({extra: shard.name}))
    _refused(model_dir, shard.name, "unexpected tensor", extra)


def test_tensor_in_a_shard_but_not_in_the_index_is_refused(model_dir):
    shard = shard_of(model_dir, K_PROJ)
    extra = "model.layers.0.self_attn.stray.weight"
    replace_tensors(shard, lambda t: t.update({extra: torch.zeros(2, 2)}))
    _refused(model_dir, shard.name, extra)


def test_shard_named_in_index_but_absent_is_refused(model_dir):
    shard = shard_of(model_dir, K_PROJ)
    shard.unlink()
    _refused(model_dir, shard.name, "absent")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_weights_are_reported_and_fatal_on_request(model_dir, bad):
    shard = shard_of(model_dir, K_PROJ)

    def poison(t: dict) -> None:
        t[K_PROJ][0, :3] = bad

    replace_tensors(shard, poison)
    report = load_model(model_dir).report
    assert not report["ok"]
    [problem] = report["problems"]
    assert problem["tensor"] == K_PROJ and problem["file"] == shard.name
    kind = "nan" if bad != bad else "inf"
    assert report["stats"][K_PROJ][kind] == 3
    _refused(model_dir, shard.name, K_PROJ, "NaN", fail_on_nonfinite=True)


def test_manifest_is_checked(model_dir):
    report = load_model(model_dir).report
    manifest = [{"name": s["file"], "size": s["size"], "sha256": s["sha256"]} for s in report["shards"]]
    good = load_model(model_dir, manifest=manifest).report
    assert good["ok"] and all(s["matches"] and s["expected_sha256"] == s["sha256"] for s in good["shards"])
    assert good["manifest"] == {"files": len(manifest), "matched": len(manifest)}
    first = manifest[0]["name"]

    def problems(entries) -> list[str]:
        result = load_model(model_dir, manifest=entries).report
        assert not result["ok"]
        return [f"{p['file']}: {p['problem']}" for p in result["problems"]]

    wrong = [{**manifest[0], "sha256": "0" * 64}, *manifest[1:]]
    assert problems(wrong) == [f"{first}: sha256 {manifest[0]['sha256']} does not match the manifest's {'0' * 64}"]
    assert problems([{**manifest[0], "size": 1}, *manifest[1:]]) == [
        f"{first}: size {manifest[0]['size']} bytes does not match the manifest's 1"]
    assert problems(manifest[1:]) == [f"{first}: not listed in the checksum manifest"]
    extra = [*manifest, {"name": "model-extra.safetensors", "size": 8, "sha256": "1" * 64}]
    assert problems(extra)[0].startswith("model-extra.safetensors: listed in the checksum manifest")
    # the older {name: sha256} form still works
    assert load_model(model_dir, manifest={m["name"]: m["sha256"] for m in manifest}).report["ok"]


@pytest.mark.parametrize(("manifest", "message"), [
    ([], "empty"),
    ("abc", "must be a list"),
    ([{"name": "a/b.safetensors", "sha256": "0" * 64}], "manifest[0].name"),
    ([{"name": "x.safetensors", "sha256": "xyz"}], "manifest[0].sha256 (x.safetensors) must be 64 hexadecimal"),
    ([{"name": "x.safetensors", "sha256": "0" * 64, "size": -1}], "manifest[0].size"),
    ([{"name": "x.safetensors", "sha256": "0" * 64, "mtime": 3}], "unknown keys ['mtime']"),
    # the portal's limit: one manifest rule on both sides (contract.manifest)
    ([{"name": f"m{i}.safetensors", "sha256": "0" * 64} for i in range(10_001)], "at most 10000 are accepted"),
])
def test_a_malformed_manifest_is_refused_before_loading(model_dir, manifest, message):
    _refused(model_dir, "checksum manifest", message, manifest=manifest)


def test_bfloat16_load_casts_weights(model_dir):
    model = load_model(model_dir, dtype="bfloat16").model
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.kv_cache_spec().dtype == torch.bfloat16


def test_unknown_architecture_without_fallback_support_names_it(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch"}))
    save_file({"w": torch.zeros(1)}, d / "model.safetensors")
    _refused(d, "NoSuch")


def test_bf16_checkpoint_may_keep_tensors_in_fp32_but_not_in_other_dtypes(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (model_dir / "config.json").write_text(json.dumps(config))
    for shard in model_dir.glob("model-*.safetensors"):
        replace_tensors(shard, lambda t: t.update({k: v.bfloat16() for k, v in t.items() if k != K_PROJ}))
    assert load_model(model_dir).report["ok"]  # k_proj stayed F32: accepted
    shard = shard_of(model_dir, K_PROJ)
    replace_tensors(shard, lambda t: t.update({K_PROJ: t[K_PROJ].to(torch.int32)}))
    _refused(model_dir, shard.name, K_PROJ, "dtype I32")


GATE = "model.layers.0.mlp.gate_proj.weight"
UP = "model.layers.0.mlp.up_proj.weight"


def _mapped(param: torch.Tensor, path: Path) -> bool:
    """True when ``param``'s bytes lie in a mapping of ``path`` (this process's /proc/self/maps)."""
    start = param.data_ptr()
    end = start + param.numel() * param.element_size()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= start and end <= hi and len(fields) == 6 and fields[5].strip() == str(path):
            return True
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_gate_and_up_stored_back_to_back_become_one_mapped_parameter_without_a_copy(model_dir):
    shard = shard_of(model_dir, GATE)
    names = [n for n, _ in sorted(header_names(shard), key=lambda t: t[1])]
    assert names.index(UP) == names.index(GATE) + 1  # safetensors orders a file's tensors by name
    result = load_model(model_dir)
    merged = result.model.model.layers[0].mlp.gate_up_proj.weight
    tensors = load_file(shard)
    torch.testing.assert_close(merged, torch.cat([tensors[GATE], tensors[UP]]), rtol=0, atol=0)
    assert _mapped(merged, shard.resolve())
    copied = load_model(model_dir, zero_copy=False)
    assert not _mapped(copied.model.model.layers[0].mlp.gate_up_proj.weight, shard.resolve())
    assert result.report["zero_copy_bytes"] - copied.report["zero_copy_bytes"] >= merged.numel() * 4
    assert GATE in result.report["stats"] and UP in result.report["stats"]  # statistics per checkpoint tensor
    assert result.report["stats"][UP]["absmax"] == pytest.approx(tensors[UP].abs().max().item())
    x = torch.randn(3, merged.shape[1], generator=torch.Generator().manual_seed(0))
    mlp, mlp_copied = result.model.model.layers[0].mlp, copied.model.model.layers[0].mlp
    torch.testing.assert_close(mlp(x), mlp_copied(x), rtol=0, atol=0)


def _write_in_order(path: Path, tensors: dict[str, torch.Tensor], order: list[str]) -> None:
    """A safetensors file whose data lies in ``order`` (``save_file`` would sort it by name)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in order:
        raw = tensors[name].contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
@pytest.mark.parametrize("where", ["up first", "another tensor between"])
def test_gate_and_up_not_stored_in_the_parameters_order_are_copied_into_place(model_dir, where):
    shard = shard_of(model_dir, GATE)
    tensors = {k: v.clone() for k, v in load_file(shard).items()}  # load_file's tensors may map the file
    rest = [n for n in sorted(tensors) if n not in (GATE, UP)]
    order = [UP, GATE, *rest] if where == "up first" else [GATE, rest[0], UP, *rest[1:]]
    _write_in_order(shard, tensors, order)
    result = load_model(model_dir)
    assert result.report["ok"]
    merged = result.model.model.layers[0].mlp.gate_up_proj.weight
    torch.testing.assert_close(merged, torch.cat([tensors[GATE], tensors[UP]]), rtol=0, atol=0)
    assert not _mapped(merged, shard.resolve())
    other = shard_of(model_dir, "model.layers.1.mlp.gate_proj.weight")
    if other != shard:  # an untouched shard still gives its merged parameter without a copy
        assert _mapped(result.model.model.layers[1].mlp.gate_up_proj.weight, other.resolve())
