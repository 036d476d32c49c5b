"""Strict streaming loader: ``load_model(model_dir) -> LoadResult``.

Headers are validated before mapping; every checkpoint tensor is checked (name, shape, dtype) against what the
model expects before any byte is copied; tensors then stream one at a time from the mapping into the
already-allocated parameters (each rank copies only its slice) and their pages are dropped from the process
right after, so no second copy of the model is ever resident. On the CPU a tensor that is already what its
parameter needs is not copied at all: the parameter adopts the mapped bytes (``zero_copy``), and so does a
merged parameter (gate/up) whose shards the file stores back to back in its order. A shard that goes unchanged
into part of a parameter (a stacked expert's w1/w3/w2, q/k/v) is read straight there from the file instead, on a
thread per core (``direct.py``), as is an expert shard packed into its panels when ``pack_weights``. A block-scaled FP8 weight
streams together with its ``_scale_inv`` as one ``BlockFp8Tensor``; the parameter's weight loader dequantises it
(``layers/quant.py``), and its statistics are those of the dequantised values. A directory holding one GGUF
file and no config.json is a GGUF release (``gguf_release.py``: dequantised at load), and a config declaring an
integer format (compressed-tensors pack-quantized, GPTQ, AWQ) goes to ``int_release.py`` (dequantised at load).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from agents.runtime.distributed import get_ep_rank, get_tp_rank
from agents.runtime.layers.int_quant import int_format
from agents.runtime.layers.quant import BlockFp8Tensor
from agents.runtime.layers.weights import adopt_or_copy, mapped_tensor
from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.direct import DirectReader, direct_reads
from agents.runtime.loader.gguf_release import gguf_file, load_gguf
from agents.runtime.loader.hashing import ShardHasher, hash_workers
from agents.runtime.loader.int_release import load_int_release
from agents.runtime.loader.manifest import compare_manifest, parse_manifest
from agents.runtime.loader.memory import advise_huge_pages
from agents.runtime.loader.quantized import check_parts, prepare_native, quant_report, quantized_tensor, release
from agents.runtime.loader.safetensors_file import DTYPES, LoadError, MappedFile, TensorEntry
from agents.runtime.loader.stats import current_rss, peak_rss, reset_peak_rss, tensor_stats
from agents.runtime.loader.validate import declared_tensors, torch_dtype, validate
from agents.runtime.models.registry import build_model
from contract.planner.formats import RUNTIME_NATIVE, checkpoint_format, format_label

__all__ = ["LoadError", "LoadResult", "load_model", "torch_dtype"]


@dataclass
class LoadResult:
    model: Any  # RuntimeModel, weights loaded, eval mode
    report: dict[str, Any]  # the `load` section of the stage report
    config: dict[str, Any]


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


def load_model(
    model_dir: Path | str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    manifest: Any = None,
    fail_on_nonfinite: bool = False,
    progress: Callable[[int, int], None] | None = None,
    stats: bool = True,
    checksum_cache: bool = True,
    zero_copy: bool = True,
    quant_mode: str = "auto",
    hardware_declares: bool | None = None,
    pack_weights: bool = False,
) -> LoadResult:
    """Build the model for ``model_dir/config.json`` and stream its safetensors weights into it, strictly.

    ``manifest`` is the release's checksum manifest (``[{name, size, sha256}]``, or ``{name: sha256}``; see
    ``loader/manifest.py``; a malformed one is a LoadError before anything loads). Every shard's digest and size
    are compared with it: each shard row gains ``expected_sha256`` and ``matches``, and every disagreement (a
    digest, a size, a shard missing from either side) is a problem naming the shard and both values, so the
    report says ``ok: false``. Statistics and checksums are computed on the first rank only (other TP/EP ranks read only their slices). ``checksum_cache`` lets a shard whose file
    identity is unchanged since it was last hashed reuse that digest (see ``loader/hashing.py``); each shard's
    report says whether its digest was "computed" or came from the "cache". With ``zero_copy`` a CPU parameter
    that needs no slicing or casting keeps the mapped checkpoint bytes as its storage (a private mapping: the
    weights survive a rename or delete of the files, but rewriting a shard in place while serving is unsafe).
    ``quant_mode`` (``auto``, ``native``, ``emulated``; ``layers/fp8_native.py``) chooses how an FP8 per-tensor /
    per-channel release runs: ``auto`` keeps it FP8 (W8A8) where ``hardware_declares`` (the job's hardware
    declares float8) or the device has FP8; a forced ``native`` on any other format is a LoadError naming it.
    ``pack_weights`` returns the model packed as ``model.pack_weights()`` packs it (``day0 serve``'s default on a
    CPU in fp32), its routed experts packed into their panels straight from the checkpoint while loading
    (``panels_at_load``: one copy, no stacked tensor); the report's ``packed_weights`` says how many weights."""
    model_dir = Path(model_dir)
    try:
        expected = parse_manifest(manifest) if manifest is not None else None
    except ValueError as exc:
        raise LoadError(f"checksum manifest: {exc}") from exc
    reset_peak_rss()
    rss_before = current_rss()
    t0 = time.perf_counter()
    gguf = gguf_file(model_dir) if not (model_dir / "config.json").exists() else None
    if gguf is not None or quant_mode not in ("auto", "emulated"):
        _refuse_native(model_dir, quant_mode, gguf)
    if gguf is not None:  # a GGUF release: dequantised at load (emulated), no safetensors, no manifest check
        model, report, config = load_gguf(gguf, dtype=torch_dtype(dtype), device=device)
        return _outside_safetensors(model, report, config, expected, rss_before, pack_weights)
    config = read_config(model_dir)
    try:
        int_fmt = int_format(config)
    except ValueError as exc:
        raise LoadError(f"config.json: {exc}") from exc
    if int_fmt is not None:  # integer weights (compressed-tensors, GPTQ, AWQ): dequantised at load (emulated)
        model, report = load_int_release(model_dir, config, int_fmt, dtype=torch_dtype(dtype), device=device)
        return _outside_safetensors(model, report, config, expected, rss_before, pack_weights)
    ckpt = Checkpoint.open(model_dir)
    lead = get_tp_rank() == 0 and get_ep_rank() == 0
    hasher = ShardHasher(ckpt.files, checksum_cache) if lead else None
    try:
        model = build_model(config, dtype=torch_dtype(dtype), device=device)
    except (ValueError, NotImplementedError) as exc:
        arch = (config.get("architectures") or [None])[0]
        raise LoadError(f"config.json: architecture {arch!r}: {exc}") from exc
    declared = declared_tensors(model, config)
    scales = validate(ckpt, declared, getattr(model, "is_ignored", None), config)
    blocks = {name: declared[name].fp8.block for name in scales}
    quantized = check_parts(ckpt, declared)  # registered formats (MXFP4, NVFP4, FP8 per tensor/channel, ...)
    try:
        mode, native = prepare_native(model, quantized, declared, quant_mode, hardware_declares, device)
    except ValueError as exc:
        raise LoadError(str(exc)) from exc
    if mode == "native" and not native and (quantized or scales):
        raise LoadError(f"--quant-mode native: no weight of this release can be held in FP8 "
                        f"({'block FP8' if scales else 'its format'} has no native path in the runtime)")
    panels = model.panels_at_load() if pack_weights and hasattr(model, "panels_at_load") else 0
    advise_huge_pages([p.data for p in model.parameters()])

    report: dict[str, Any] = {"ok": True, "path": model.path, "architecture": config.get("architectures", [None])[0],
                              "dtype": str(torch_dtype(dtype)).removeprefix("torch."), "problems": [], "stats": {}}
    # Largest first: a parameter's pages become resident only when written, so while a big tensor's source is
    # mapped few parameters are resident yet, and the peak stays near the model's size.
    # FP8 scales travel with their weights, not on their own.
    scale_names = {e.name for e in scales.values()} | {e.name for v in quantized.values() for e in v.values()}
    elsewhere = getattr(model, "other_stage", lambda name: False)  # pipeline parallel: another rank's tensors
    ignored = getattr(model, "is_ignored", elsewhere)
    runs = _stored_runs(model, ckpt, set(scales) | scale_names, ignored) if zero_copy else []  # CPU params only
    in_runs = {e.name for _, group in runs for e in group}
    # shards that go unchanged into part of a parameter (stacked experts, merged linears): read straight there
    direct = direct_reads(model, ckpt, set(scales) | scale_names | in_runs, ignored)
    in_direct = {e.name for e, _ in direct}
    entries = sorted((e for e in ckpt.tensors.values() if e.name not in scale_names and e.name not in in_runs
                      and e.name not in in_direct and not elsewhere(e.name)),
                     key=lambda e: (-e.nbytes, e.file.name, e.start))
    state = {"current": None, "bytes": 0, "adopted": 0}
    total_entries = len(entries) + len(in_runs) + len(quantized) + len(direct)

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        mapped = {path: MappedFile(path) for path in ckpt.files}
        reader = DirectReader(direct, hash_workers(), stats and lead) if direct else None
        try:
            done = 0
            for param, group in runs:  # merged parameters stored back to back: adopted whole, nothing copied
                state["current"] = group[0]
                source = mapped[group[0].file]
                whole = mapped_tensor(source.view(group[0].start, group[-1].end, param.dtype, tuple(param.shape)))
                adopt_or_copy(param, whole)
                adopted = getattr(whole, "_day0_adopted", False)
                source.keep |= adopted
                for entry in group:
                    if stats and lead:
                        _record(entry, tensor_stats(source.tensor(entry)), report, fail_on_nonfinite)
                    if not adopted:
                        source.release(entry.start, entry.end)
                    state["adopted"] += entry.nbytes if adopted else 0
                    state["bytes"] += entry.nbytes
                    done += 1
                    if progress is not None:
                        progress(done, total_entries)
            for name, parts in quantized.items():  # each weight's parts together, dequantised by its loader
                done += 1
                if elsewhere(name):
                    continue
                state["current"] = parts["values"]
                item = quantized_tensor(declared[name].quant, parts, mapped)
                yield name, item
                if stats and lead:
                    values = item.dequantized if item.dequantized is not None else item.dequantize(torch.float32)
                    _record(replace(parts["values"], name=name), tensor_stats(values), report, fail_on_nonfinite)
                del item
                state["bytes"] += release(parts, mapped)
                if progress is not None:
                    progress(done, total_entries)
            for entry in entries:
                done += 1
                state["current"] = entry
                source = mapped[entry.file]
                tensor = source.tensor(entry)
                if zero_copy:
                    mapped_tensor(tensor)  # weight loaders may adopt it as the parameter itself
                scale = scales.get(entry.name)
                item: torch.Tensor | BlockFp8Tensor = tensor
                if scale is not None:
                    item = BlockFp8Tensor(entry.name, tensor, mapped[scale.file].tensor(scale), blocks[entry.name])
                elif stats and lead:
                    _record(entry, tensor_stats(tensor), report, fail_on_nonfinite)
                yield entry.name, item
                if scale is not None:
                    if stats and lead:  # on the dequantised values (as loaded, or in fp32 if the loader skipped it)
                        values = item.dequantized if item.dequantized is not None else item.dequantize(torch.float32)
                        _record(entry, tensor_stats(values), report, fail_on_nonfinite)
                    mapped[scale.file].release(scale.start, scale.end)
                    state["bytes"] += scale.nbytes
                    del item
                if getattr(tensor, "_day0_adopted", False):
                    source.keep = True
                    state["adopted"] += entry.nbytes
                else:
                    source.release(entry.start, entry.end)
                del tensor
                state["bytes"] += entry.nbytes
                if progress is not None:
                    progress(done, total_entries)
            for entry, st in reader.done() if reader is not None else ():
                done += 1
                state["current"] = entry
                if st is not None:
                    _record(entry, st, report, fail_on_nonfinite)
                state["bytes"] += entry.nbytes
                if progress is not None:
                    progress(done, total_entries)
        finally:
            if reader is not None:
                reader.close()
            for source in mapped.values():
                source.close()

    try:
        with _one_thread_while(hasher, bool(direct)):
            model.load_weights(stream())
    except LoadError:
        raise
    except Exception as exc:
        entry: TensorEntry | None = state["current"]
        where = f"{entry.file.name}: tensor {entry.name!r}: " if entry else ""
        raise LoadError(f"{where}{exc}") from exc
    direct.clear()  # its views hold the parameters' first storage: packing must be able to free it
    runs.clear()
    for param in model.parameters() if panels else ():  # loaded: a reload is refused, as after pack_weights
        param.loads_panels = False
    report["packed_weights"] = panels + _pack(model) if pack_weights else None
    shards = _checksums(ckpt, hasher)
    if expected is not None and hasher is not None:  # the lead rank hashes every shard and checks them
        report["problems"] += compare_manifest(shards, expected)
        report["manifest"] = {"files": len(expected), "matched": sum(1 for s in shards if s.get("matches"))}
    seconds = time.perf_counter() - t0
    total = sum(e.nbytes for e in ckpt.tensors.values())
    report.update(
        ok=not report["problems"], tensors=len(ckpt.tensors), fp8_tensors=len(scales), bytes=total, seconds=round(seconds, 4),
        gb_per_s=round(total / seconds / 1e9, 3) if seconds > 0 else None, peak_rss_bytes=peak_rss(),
        rss_before_bytes=rss_before, shards=shards, zero_copy_bytes=state["adopted"],
        sha256={"workers": hasher.workers, "seconds": round(hasher.seconds, 4), "computed_bytes": hasher.computed_bytes}
        if hasher is not None else None,
    )
    if quantized:
        report["quant"] = quant_report(quantized, declared, torch_dtype(dtype), device, model, native)
    return LoadResult(model=model, report=report, config=config)


def _refuse_native(model_dir: Path, quant_mode: str, gguf: Path | None) -> None:
    """``quant_mode`` checked before anything loads: a forced ``native`` on a release without a native path
    (GGUF, integer and FP4 formats, block FP8, an unquantised release) is a LoadError naming its format."""
    if quant_mode not in ("auto", "native", "emulated"):
        raise LoadError(f"quant mode {quant_mode!r}: expected auto, native or emulated")
    if quant_mode != "native":
        return
    if gguf is not None:
        raise LoadError(f"--quant-mode native: GGUF ({gguf.name}) has no native path in the runtime (native: FP8 "
                        f"per tensor and per channel); it runs emulated (dequantized at load)")
    found = checkpoint_format(read_config(model_dir))
    if found is None or found[0] not in RUNTIME_NATIVE:
        what = format_label(found[0]) if found else "an unquantised release"
        raise LoadError(f"--quant-mode native: {what} has no native path in the runtime (native: FP8 per tensor "
                        f"and per channel); it runs emulated (dequantized at load)")


def _pack(model: Any) -> int:
    """``model.pack_weights()`` where the model has it (the native decoders): how many weights it packed."""
    return model.pack_weights() if hasattr(model, "pack_weights") else 0


def _outside_safetensors(model: Any, report: dict[str, Any], config: dict[str, Any], expected: Any,
                         rss_before: int, pack_weights: bool) -> LoadResult:
    """A GGUF or integer-format load's result: its shards compared with the manifest like any load's."""
    report["packed_weights"] = _pack(model) if pack_weights else None
    if expected is not None:
        report["problems"] += compare_manifest(report["shards"], expected)
        report["manifest"] = {"files": len(expected), "matched": sum(1 for s in report["shards"] if s.get("matches"))}
        report["ok"] = not report["problems"]
    report.update(peak_rss_bytes=peak_rss(), rss_before_bytes=rss_before, sha256=None)
    return LoadResult(model=model, report=report, config=config)


@contextmanager
def _one_thread_while(hasher: ShardHasher | None, reading: bool = False) -> Iterator[None]:
    """Copy on one thread while shards are being hashed or read straight into parameters: the hash threads or the
    read threads already hold every core, and a second OpenMP team beside them only contends (its barrier waits
    spin on cores they need)."""
    threads = torch.get_num_threads()
    fewer = (reading or hasher is not None and hasher.busy) and threads > 1
    if fewer:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if fewer:
            torch.set_num_threads(threads)


def _stored_runs(model: Any, ckpt: Checkpoint, skip: set[str],
                 ignored: Callable[[str], bool]) -> list[tuple[torch.nn.Parameter, list[TensorEntry]]]:
    """Merged parameters (q/k/v, gate/up) that the checkpoint already stores as they are laid out: every shard
    whole (no TP slice), in the parameter's dtype, back to back in one file and in the parameter's shard order.
    safetensors writers order a file's tensors by name, so ``gate_proj`` is followed by ``up_proj`` in most
    checkpoints (q/k/v have ``o_proj`` between them). Each such parameter is adopted as one mapped range instead
    of being copied shard by shard. FP8-scaled, ignored and other ranks' tensors are left to the stream."""
    name_of = getattr(getattr(model, "mapping", None), "checkpoint_name", None)
    if name_of is None:
        return []
    runs = []
    for param_name, param in model.named_parameters():
        whole = getattr(param, "concatenates_shards", None)
        shards = getattr(param, "shards", [])
        if whole is None or len(shards) < 2 or param.device.type != "cpu" or not whole():
            continue
        group = [ckpt.tensors.get(name_of(param_name, shard)) for shard in shards]
        if any(e is None or e.name in skip or ignored(e.name) or e.file != group[0].file
               or DTYPES[e.dtype] != param.dtype or tuple(e.shape[1:]) != tuple(param.shape[1:]) for e in group):
            continue
        if any(b.start != a.end for a, b in zip(group, group[1:], strict=False)):
            continue
        if sum(e.shape[0] for e in group) != param.shape[0]:
            continue
        runs.append((param, group))
    return runs


def _record(entry: TensorEntry, st: dict[str, Any], report: dict[str, Any], fatal: bool) -> None:
    report["stats"][entry.name] = st
    if st["nan"] or st["inf"]:
        problem = f"{st['nan']} NaN and {st['inf']} Inf values"
        report["problems"].append({"tensor": entry.name, "file": entry.file.name, "problem": problem})
        if fatal:
            raise LoadError(f"{entry.file.name}: tensor {entry.name!r} has {problem}")


def _checksums(ckpt: Checkpoint, hasher: ShardHasher | None) -> list[dict]:
    """One row per shard: file, sha256 (None on ranks that do not hash), where the digest came from, size."""
    digests = hasher.result() if hasher is not None else {}
    rows = []
    for path in ckpt.files:
        digest, source = digests.get(path.name, (None, None))
        size = path.stat().st_size
        rows.append({"file": path.name, "sha256": digest, "sha256_source": source, "size": size, "bytes": size})
    return rows
