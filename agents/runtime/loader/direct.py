"""Checkpoint tensors read straight from their file into their place in a parameter: ``pread`` copies the bytes
from the page cache into the parameter's memory in the kernel, once. No mapping of the source (no page tables
filled and dropped again), no torch copy (whose OpenMP team, on a machine whose cores are busy, spins at its
barrier on a core another process holds), and the reads run on a few threads that release the GIL, beside the
stream of the other tensors.

A parameter says where a shard's bytes go unchanged with ``direct_target(param, shard_id)``: a contiguous view
of itself of the shard's checkpoint shape, or None (a TP slice, a shard that is the whole parameter: that one
is adopted, zero-copy). The stacked routed experts (``layers/moe.py``: each expert's w1, w3 and w2 whole into
``w13[e]`` and ``w2[e]``) and merged linears (q/k/v, gate/up shards not stored back to back) say so.

A parameter that re-lays its shards instead (routed experts loaded as panels, ``RoutedExperts.load_as_panels``)
gives ``direct_fill(param, shard_id)``: a function of the mapped checkpoint tensor that writes it in place. Fills
run on the same threads, each from its own mapping of the range (dropped right after), each thread's OpenMP
regions on that thread alone (``kernels.one_thread_here``): one pack per shard per core, no team spinning."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

from agents.runtime import kernels
from agents.runtime.layers.linear import is_packed
from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.safetensors_file import DTYPES, LoadError, MappedFile, TensorEntry
from agents.runtime.loader.stats import tensor_stats

Fill = Callable[[torch.Tensor], None]
Action = torch.Tensor | Fill  # the view the bytes go to, or the function that writes the mapped tensor in place


def direct_reads(model: torch.nn.Module, ckpt: Checkpoint, skip: set[str],
                 ignored: Callable[[str], bool]) -> list[tuple[TensorEntry, Action]]:
    """(checkpoint tensor, the parameter view its bytes go to unchanged, or the fill that writes it) for every
    CPU parameter shard that has one: a view of the same dtype and shape, contiguous. Tensors in ``skip``
    (FP8-scaled, quantised, adopted runs), ignored ones and other ranks' stay with the stream."""
    name_of = getattr(getattr(model, "mapping", None), "checkpoint_name", None)
    if name_of is None:
        return []
    out = []
    for param_name, param in model.named_parameters():
        target, fill = getattr(param, "direct_target", None), getattr(param, "direct_fill", None)
        if param.device.type != "cpu":
            continue
        for shard in param.shards:
            entry = ckpt.tensors.get(name_of(param_name, shard))
            if entry is None or entry.name in skip or ignored(entry.name):
                continue
            writer = fill(param, shard) if fill is not None else None
            if writer is not None:
                out.append((entry, writer))
                continue
            if target is None or is_packed(param) or DTYPES[entry.dtype] != param.dtype:  # packed: the stream refuses
                continue
            view = target(param, shard)
            if (view is None or view.dtype != param.dtype or tuple(view.shape) != entry.shape
                    or not view.is_contiguous() or view.numel() * view.element_size() != entry.nbytes):
                continue
            out.append((entry, view))
    return out


def read_into(fd: int, entry: TensorEntry, dest: torch.Tensor) -> torch.Tensor:
    """Bytes ``[entry.start, entry.end)`` of the open file ``fd`` into contiguous CPU tensor ``dest``; returns it."""
    size = entry.nbytes
    if size == 0:
        return dest
    buf = memoryview((ctypes.c_char * size).from_address(dest.data_ptr())).cast("B")
    done = 0
    while done < size:
        n = os.preadv(fd, [buf[done:]], entry.start + done)
        if n <= 0:
            raise LoadError(f"{entry.file.name}: tensor {entry.name!r}: the file ends {size - done} bytes short of "
                            f"the tensor (changed on disk while loading?)")
        done += n
    return dest


def _read(fd: int, entry: TensorEntry, dest: torch.Tensor, stats: bool) -> dict | None:
    read_into(fd, entry, dest)
    return tensor_stats(dest) if stats else None


def _fill(source: MappedFile, entry: TensorEntry, fill: Fill, stats: bool) -> dict | None:
    """Map the entry's range, let ``fill`` write it in place (its statistics taken from the mapped values), drop
    the mapped pages."""
    try:
        values = source.tensor(entry)
        fill(values)
        return tensor_stats(values) if stats else None
    finally:
        source.release(entry.start, entry.end)


class DirectReader:
    """Runs each (entry, view or fill) on ``workers`` threads, from the start, largest first; ``done()`` yields
    (entry, its ``tensor_stats`` or None without ``stats``) as each finishes (a failure is a LoadError naming
    the file and tensor). ``close()`` must follow."""

    def __init__(self, items: list[tuple[TensorEntry, Action]], workers: int, stats: bool) -> None:
        self._fds: dict[Path, int] = {}
        self._maps: dict[Path, MappedFile] = {}
        self._futures: dict[Future, TensorEntry] = {}
        self._pool = ThreadPoolExecutor(max(1, min(workers, len(items))), thread_name_prefix="day0-read",
                                        initializer=kernels.one_thread_here)
        try:
            for entry, action in sorted(items, key=lambda r: -r[0].nbytes):  # the threads finish together
                if isinstance(action, torch.Tensor):
                    if entry.file not in self._fds:
                        self._fds[entry.file] = os.open(entry.file, os.O_RDONLY)
                    future = self._pool.submit(_read, self._fds[entry.file], entry, action, stats)
                else:
                    if entry.file not in self._maps:
                        self._maps[entry.file] = MappedFile(entry.file)
                    future = self._pool.submit(_fill, self._maps[entry.file], entry, action, stats)
                self._futures[future] = entry
        except OSError as exc:
            self.close()
            raise LoadError(f"{exc.filename}: cannot open: {exc.strerror}") from exc

    def done(self) -> Iterator[tuple[TensorEntry, dict | None]]:
        for future in as_completed(self._futures):
            entry = self._futures[future]
            exc = future.exception()
            if isinstance(exc, LoadError):
                raise exc
            if exc is not None:
                raise LoadError(f"{entry.file.name}: tensor {entry.name!r}: {exc}") from exc
            yield entry, future.result()

    def close(self) -> None:
        """Cancel what has not started, wait for what has, close the files and mappings."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for fd in self._fds.values():
            os.close(fd)
        for source in self._maps.values():
            source.close()
        self._fds, self._maps = {}, {}
