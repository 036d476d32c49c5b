"""A checkpoint directory: ``model.safetensors.index.json`` or a single ``model.safetensors``; every shard
named must exist and every tensor the index names must be in its shard's header."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agents.runtime.loader.safetensors_file import LoadError, TensorEntry, read_header

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass
class Checkpoint:
    directory: Path
    files: list[Path]
    tensors: dict[str, TensorEntry]

    @property
    def index_name(self) -> str:
        return INDEX if (self.directory / INDEX).exists() else SINGLE

    @classmethod
    def open(cls, directory: Path | str) -> Checkpoint:
        directory = Path(directory)
        index = directory / INDEX
        if index.exists():
            weight_map = _weight_map(index)
            names = sorted(set(weight_map.values()))
            for name in names:
                if not (directory / name).is_file():
                    first = next(t for t, f in weight_map.items() if f == name)
                    raise LoadError(f"{name}: shard named in {INDEX} (for tensor {first!r}) is absent from {directory}")
        elif (directory / SINGLE).is_file():
            weight_map, names = None, [SINGLE]
        else:
            raise LoadError(f"{directory}: no {INDEX} and no {SINGLE}")
        files = [directory / n for n in names]
        tensors: dict[str, TensorEntry] = {}
        for path in files:
            for name, entry in read_header(path).items():
                if name in tensors:
                    raise LoadError(f"{path.name}: tensor {name!r} is also in {tensors[name].file.name}")
                if weight_map is not None and weight_map.get(name) != path.name:
                    raise LoadError(f"{path.name}: tensor {name!r} is not assigned to this shard by {INDEX} "
                                    f"(index says {weight_map.get(name)!r})")
                tensors[name] = entry
        if weight_map is not None:
            for name, file in weight_map.items():
                if name not in tensors:
                    raise LoadError(f"{file}: tensor {name!r} is named in {INDEX} but absent from the shard header")
        return cls(directory, files, tensors)


def _weight_map(index: Path) -> dict[str, str]:
    try:
        data = json.loads(index.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoadError(f"{index.name}: unreadable index: {exc}") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise LoadError(f"{index.name}: no 'weight_map' object of tensor -> file")
    for tensor, file in weight_map.items():
        if Path(file).name != file:
            raise LoadError(f"{index.name}: tensor {tensor!r} maps to {file!r}, which is not a file in the directory")
    return weight_map
