"""Editing a test checkpoint's safetensors files (headers, tensors, the index) for the loader's tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from safetensors.torch import load_file, save_file

EMBED = "model.embed_tokens.weight"
K_PROJ = "model.layers.0.self_attn.k_proj.weight"


def index(d: Path) -> dict:
    return json.loads((d / "model.safetensors.index.json").read_text())


def shard_of(d: Path, tensor: str) -> Path:
    return d / index(d)["weight_map"][tensor]


def header_names(path: Path) -> list[tuple[str, int]]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    return [(k, v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]


def rewrite_header(path: Path, edit) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


def replace_tensors(path: Path, edit) -> None:
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def set_index(d: Path, edit) -> None:
    idx = index(d)
    edit(idx["weight_map"])
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
