"""Strict streaming loader: ``load_model(model_dir) -> LoadResult``.

Headers are validated before mapping; every checkpoint tensor is checked (name, shape, dtype) against what the
model expects before any byte is copied; tensors then stream one at a time from the mapping into the
already-allocated parameters (each rank copies only its slice) and their pages are dropped from the process
right after, so no second copy of the model is ever resident.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agents.runtime.distributed import get_ep_rank, get_tp_rank
from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.hashing import ShardHasher
from agents.runtime.loader.memory import advise_huge_pages
from agents.runtime.loader.safetensors_file import DTYPES, NAMES, LoadError, MappedFile, TensorEntry
from agents.runtime.loader.stats import current_rss, peak_rss, reset_peak_rss, tensor_stats
from agents.runtime.models.registry import build_model

__all__ = ["LoadError", "LoadResult", "load_model", "torch_dtype"]


@dataclass
class LoadResult:
    model: Any  # RuntimeModel, weights loaded, eval mode
    report: dict[str, Any]  # the `load` section of the stage report
    config: dict[str, Any]


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
    if name not in table:
        raise ValueError(f"unsupported dtype {name!r} (use float32, bfloat16 or float16)")
    return table[name]


def read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise LoadError(f"config.json: not found in {model_dir}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise LoadError(f"config.json: unreadable: {exc}") from exc
    if not isinstance(config, dict):
        raise LoadError("config.json: not a JSON object")
    return config


def checkpoint_dtype(config: dict[str, Any]) -> str | None:
    """The safetensors dtype code the config declares for the weights, if it declares one."""
    name = config.get("torch_dtype") or config.get("dtype")
    if not name:
        return None
    try:
        return NAMES[torch_dtype(name)]
    except ValueError:
        return None


def _validate(ckpt: Checkpoint, model: Any, config: dict[str, Any]) -> None:
    """Every name, shape and dtype checked before any copy: errors name the file and the tensor."""
    expected = model.expected_tensors()
    is_ignored = getattr(model, "is_ignored", None)
    declared = checkpoint_dtype(config)
    for name, entry in ckpt.tensors.items():
        if name not in expected:
            if is_ignored is not None and not is_ignored(name):
                raise LoadError(f"{entry.file.name}: unexpected tensor {name!r}: the model has no parameter for it")
            continue
        shape = expected[name][0]
        if entry.shape != tuple(shape):
            raise LoadError(f"{entry.file.name}: tensor {name!r} has shape {list(entry.shape)}, "
                            f"the model expects {list(shape)}")
        # The declared dtype, or F32 (kept in full precision, e.g. routing biases in bf16 checkpoints).
        if not DTYPES[entry.dtype].is_floating_point or (declared and entry.dtype not in (declared, "F32")):
            want = f"{declared} (the config's dtype) or F32" if declared else "a floating-point dtype"
            raise LoadError(f"{entry.file.name}: tensor {name!r} has dtype {entry.dtype}, expected {want}")
    missing = sorted(set(expected) - set(ckpt.tensors))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise LoadError(f"{ckpt.index_name}: missing tensor {missing[0]!r}{more}")


def load_model(
    model_dir: Path | str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    manifest: dict[str, str] | None = None,
    fail_on_nonfinite: bool = False,
    progress: Callable[[int, int], None] | None = None,
    stats: bool = True,
    checksum_cache: bool = True,
    zero_copy: bool = True,
) -> LoadResult:
    """Build the model for ``model_dir/config.json`` and stream its safetensors weights into it, strictly.

    ``manifest`` maps shard file names to expected sha256 digests. Statistics and checksums are computed on
    the first rank only (other TP/EP ranks read only their slices). ``checksum_cache`` lets a shard whose file
    identity is unchanged since it was last hashed reuse that digest (see ``loader/hashing.py``); each shard's
    report says whether its digest was "computed" or came from the "cache". With ``zero_copy`` a CPU parameter
    that needs no slicing or casting keeps the mapped checkpoint bytes as its storage (a private mapping: the
    weights survive a rename or delete of the files, but rewriting a shard in place while serving is unsafe)."""
    model_dir = Path(model_dir)
    reset_peak_rss()
    rss_before = current_rss()
    t0 = time.perf_counter()
    config = read_config(model_dir)
    ckpt = Checkpoint.open(model_dir)
    lead = get_tp_rank() == 0 and get_ep_rank() == 0
    hasher = ShardHasher(ckpt.files, checksum_cache) if lead or manifest else None
    try:
        model = build_model(config, dtype=torch_dtype(dtype), device=device)
    except (ValueError, NotImplementedError) as exc:
        arch = (config.get("architectures") or [None])[0]
        raise LoadError(f"config.json: architecture {arch!r}: {exc}") from exc
    _validate(ckpt, model, config)
    advise_huge_pages([p.data for p in model.parameters()])

    report: dict[str, Any] = {"ok": True, "path": model.path, "architecture": config.get("architectures", [None])[0],
                              "dtype": str(torch_dtype(dtype)).removeprefix("torch."), "problems": [], "stats": {}}
    # Largest first: a parameter's pages become resident only when written, so while a big tensor's source is
    # mapped few parameters are resident yet, and the peak stays near the model's size.
    entries = sorted(ckpt.tensors.values(), key=lambda e: (-e.nbytes, e.file.name, e.start))
    state = {"current": None, "bytes": 0, "adopted": 0}

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        mapped = {path: MappedFile(path) for path in ckpt.files}
        try:
            for done, entry in enumerate(entries, 1):
                state["current"] = entry
                source = mapped[entry.file]
                tensor = source.tensor(entry)
                tensor._day0_mapped = zero_copy  # weight loaders may adopt it as the parameter itself
                if stats and lead:
                    _record(entry, tensor_stats(tensor), report, fail_on_nonfinite)
                yield entry.name, tensor
                if getattr(tensor, "_day0_adopted", False):
                    source.keep = True
                    state["adopted"] += entry.nbytes
                else:
                    source.release(entry.start, entry.end)
                del tensor
                state["bytes"] += entry.nbytes
                if progress is not None:
                    progress(done, len(entries))
        finally:
            for source in mapped.values():
                source.close()

    try:
        model.load_weights(stream())
    except LoadError:
        raise
    except Exception as exc:
        entry: TensorEntry | None = state["current"]
        where = f"{entry.file.name}: tensor {entry.name!r}: " if entry else ""
        raise LoadError(f"{where}{exc}") from exc
    shards = _checksums(ckpt, hasher, manifest)
    seconds = time.perf_counter() - t0
    total = sum(e.nbytes for e in entries)
    report.update(
        ok=not report["problems"], tensors=len(entries), bytes=total, seconds=round(seconds, 4),
        gb_per_s=round(total / seconds / 1e9, 3) if seconds > 0 else None, peak_rss_bytes=peak_rss(),
        rss_before_bytes=rss_before, shards=shards, zero_copy_bytes=state["adopted"],
    )
    return LoadResult(model=model, report=report, config=config)


def _record(entry: TensorEntry, st: dict[str, Any], report: dict[str, Any], fatal: bool) -> None:
    report["stats"][entry.name] = st
    if st["nan"] or st["inf"]:
        problem = f"{st['nan']} NaN and {st['inf']} Inf values"
        report["problems"].append({"tensor": entry.name, "file": entry.file.name, "problem": problem})
        if fatal:
            raise LoadError(f"{entry.file.name}: tensor {entry.name!r} has {problem}")


def _checksums(ckpt: Checkpoint, hasher: ShardHasher | None, manifest: dict[str, str] | None) -> list[dict]:
    digests = hasher.result() if hasher is not None else {}
    if manifest is not None:
        for path in ckpt.files:
            want = manifest.get(path.name)
            if want is None:
                raise LoadError(f"{path.name}: not listed in the checksum manifest")
            if digests[path.name][0] != want.lower():
                raise LoadError(f"{path.name}: sha256 {digests[path.name][0]} does not match the manifest's {want}")
        extra = sorted(set(manifest) - {p.name for p in ckpt.files})
        if extra:
            raise LoadError(f"{extra[0]}: listed in the checksum manifest but not part of the checkpoint")
    return [{"file": p.name, "sha256": digests.get(p.name, (None,))[0], "sha256_source": digests.get(
        p.name, (None, None))[1], "bytes": p.stat().st_size} for p in ckpt.files]
