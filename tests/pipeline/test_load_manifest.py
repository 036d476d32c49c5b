"""Checksum manifests through the pipeline: `day0 manifest` prints one, `day0 adapt --manifest` and the
runner's ``manifest`` take one, and a shard with flipped bytes fails the load stage naming it and both digests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.pipeline.runner import run_pipeline
from day0cli.main import main
from tests.runtime.test_loader import checksum_cache, model_dir  # noqa: F401 - the loader tests' fixtures


@pytest.fixture()
def llama_dir(model_dir: Path) -> Path:  # noqa: F811 - the loader tests' fixture: a copy of the tiny Llama
    return model_dir


def _manifest(directory: Path, capsys) -> list[dict]:
    assert main(["manifest", str(directory)]) == 0
    return json.loads(capsys.readouterr().out)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last byte of the last tensor's data
    path.write_bytes(bytes(data))


def test_day0_manifest_lists_every_shard_with_size_and_sha256(llama_dir: Path, capsys) -> None:
    import hashlib

    manifest = _manifest(llama_dir, capsys)
    index = json.loads((llama_dir / "model.safetensors.index.json").read_text())
    assert [m["name"] for m in manifest] == sorted(set(index["weight_map"].values()))
    for entry in manifest:
        data = (llama_dir / entry["name"]).read_bytes()
        assert entry == {"name": entry["name"], "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_flipped_bytes_fail_load_naming_the_shard_and_both_digests(llama_dir: Path, make_ctx, capsys) -> None:
    manifest = _manifest(llama_dir, capsys)
    shard = llama_dir / manifest[1]["name"]
    _flip_last_byte(shard)
    ctx, _ = make_ctx(llama_dir, manifest=manifest)
    report = run_pipeline(ctx, "plan,load")
    assert report["failed_stage"] == "load" and report["tier"] == 1
    load = report["stages"]["load"]
    assert load["ok"] is False
    rows = {row["file"]: row for row in load["shards"]}
    bad = rows[shard.name]
    assert bad["matches"] is False and bad["expected_sha256"] == manifest[1]["sha256"] != bad["sha256"]
    assert all(row["matches"] for name, row in rows.items() if name != shard.name)
    assert shard.name in report["error"] and manifest[1]["sha256"] in report["error"] and bad["sha256"] in report["error"]


def test_adapt_takes_a_manifest_file(llama_dir: Path, tmp_path: Path, capsys) -> None:
    manifest_file = tmp_path / "manifest.json"
    assert main(["manifest", str(llama_dir), "--out", str(manifest_file)]) == 0
    report_file = tmp_path / "report.json"
    args = ["adapt", str(llama_dir), "--hardware", "cpu", "--stages", "plan,load", "--quiet",
            "--manifest", str(manifest_file), "--report", str(report_file)]
    assert main(args) == 0
    assert all(row["matches"] for row in json.loads(report_file.read_text())["stages"]["load"]["shards"])
    name = json.loads(manifest_file.read_text())[0]["name"]
    _flip_last_byte(llama_dir / name)
    assert main(args) == 1
    report = json.loads(report_file.read_text())
    assert report["failed_stage"] == "load" and name in report["error"]


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    ('[{"name": "x.safetensors", "sha256": "12"}]', "sha256 (x.safetensors) must be 64 hexadecimal digits"),
])
def test_adapt_refuses_a_bad_manifest_file_naming_it(llama_dir: Path, tmp_path: Path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["adapt", str(llama_dir), "--hardware", "cpu", "--stages", "plan", "--manifest", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and message in err


def test_the_load_answers_the_portals_weight_challenge_from_the_shards_it_loaded(llama_dir: Path, make_ctx) -> None:
    import base64
    import hashlib

    nonce = "f" * 32
    names = sorted({*json.loads((llama_dir / "model.safetensors.index.json").read_text())["weight_map"].values()})
    probes = [{"file": names[-1], "offset": 100, "length": 64}, {"file": names[0], "offset": 7, "length": 32}]
    ctx, _ = make_ctx(llama_dir, weight_samples={"count": 2, "length": 64, "positions": [0.0, 0.75]},
                      weight_probe={"nonce": nonce, "probes": probes})
    report = run_pipeline(ctx, "plan,load")
    load = report["stages"]["load"]
    assert report["tier"] == 2, report.get("error")
    assert [s["file"] for s in load["weight_samples"]] == names and "manifest" not in load
    for shard in load["weight_samples"]:
        data = (llama_dir / shard["file"]).read_bytes()
        assert shard["size"] == len(data) and [s["offset"] for s in shard["samples"]] == [0, int(0.75 * (len(data) - 64))]
        assert all(base64.b64decode(s["bytes_b64"]) == data[s["offset"]:s["offset"] + 64] for s in shard["samples"])
    for answer, probe in zip(load["weight_probe"], probes, strict=True):
        data = (llama_dir / probe["file"]).read_bytes()[probe["offset"]:probe["offset"] + probe["length"]]
        assert answer == {**probe, "sha256": hashlib.sha256(nonce.encode() + data).hexdigest()}


def test_a_probe_outside_the_loaded_shards_fails_the_load_naming_it(llama_dir: Path, make_ctx) -> None:
    ctx, _ = make_ctx(llama_dir, weight_probe={"nonce": "n" * 32, "probes": [
        {"file": "../config.json", "offset": 0, "length": 8}]})
    report = run_pipeline(ctx, "plan,load")
    assert report["failed_stage"] == "load" and "'../config.json', which is not a loaded shard" in report["error"]
