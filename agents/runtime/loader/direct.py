"""Checkpoint tensors read straight from their file into their place in a parameter: ``pread`` copies the bytes
from the page cache into the parameter's memory in the kernel, once. No mapping of the source (no page tables
filled and dropped again), no torch copy (whose OpenMP team, on a machine whose cores are busy, spins at its
barrier on a core another process holds), and the reads run on a few threads that release the GIL, beside the
stream of the other tensors.

A parameter says where a shard's bytes go unchanged with ``direct_target(param, shard_id)``: a contiguous view
of itself of the shard's checkpoint shape, or None (a TP slice, a shard that is the whole parameter: that one
is adopted, zero-copy). The stacked routed experts (``layers/moe.py``: each expert's w1, w3 and w2 whole into
``w13[e]`` and ``w2[e]``) and merged linears (q/k/v, gate/up shards not stored back to back) say so."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

import torch

from agents.runtime.layers.linear import is_packed
from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.safetensors_file import DTYPES, LoadError, TensorEntry


def direct_reads(model: torch.nn.Module, ckpt: Checkpoint, skip: set[str],
                 ignored: Callable[[str], bool]) -> list[tuple[TensorEntry, torch.Tensor]]:
    """(checkpoint tensor, the parameter view its bytes go to unchanged) for every CPU parameter shard that has
    one: same dtype, same shape, a contiguous view. Tensors in ``skip`` (FP8-scaled, quantised, adopted runs),
    ignored ones and other ranks' stay with the stream."""
    name_of = getattr(getattr(model, "mapping", None), "checkpoint_name", None)
    if name_of is None:
        return []
    out = []
    for param_name, param in model.named_parameters():
        target = getattr(param, "direct_target", None)
        if target is None or param.device.type != "cpu" or is_packed(param):  # packed: refused by the stream
            continue
        for shard in param.shards:
            entry = ckpt.tensors.get(name_of(param_name, shard))
            if entry is None or entry.name in skip or ignored(entry.name) or DTYPES[entry.dtype] != param.dtype:
                continue
            view = target(param, shard)
            if (view is None or view.dtype != param.dtype or tuple(view.shape) != entry.shape
                    or not view.is_contiguous() or view.numel() * view.element_size() != entry.nbytes):
                continue
            out.append((entry, view))
    return out


def read_into(fd: int, entry: TensorEntry, dest: torch.Tensor) -> None:
    """Bytes ``[entry.start, entry.end)`` of the open file ``fd`` into contiguous CPU tensor ``dest``."""
    size = entry.nbytes
    if size == 0:
        return
    buf = memoryview((ctypes.c_char * size).from_address(dest.data_ptr())).cast("B")
    done = 0
    while done < size:
        n = os.preadv(fd, [buf[done:]], entry.start + done)
        if n <= 0:
            raise LoadError(f"{entry.file.name}: tensor {entry.name!r}: the file ends {size - done} bytes short of "
                            f"the tensor (changed on disk while loading?)")
        done += n


class DirectReader:
    """Runs ``read_into`` for each (entry, view) on ``workers`` threads, from the start; ``done()`` yields the
    pairs as their reads finish (a failed read is a LoadError naming the file and tensor)."""

    def __init__(self, reads: list[tuple[TensorEntry, torch.Tensor]], workers: int) -> None:
        self.reads = reads
        self._fds: dict = {}
        self._pool = ThreadPoolExecutor(max(1, min(workers, len(reads))), thread_name_prefix="day0-read")
        try:
            for entry, _ in reads:
                if entry.file not in self._fds:
                    self._fds[entry.file] = os.open(entry.file, os.O_RDONLY)
        except OSError as exc:
            self.close()
            raise LoadError(f"{exc.filename}: cannot open: {exc.strerror}") from exc
        # largest first: the threads finish together
        order = sorted(reads, key=lambda r: -r[0].nbytes)
        self._futures: dict[Future, tuple[TensorEntry, torch.Tensor]] = {
            self._pool.submit(read_into, self._fds[entry.file], entry, view): (entry, view) for entry, view in order}

    def done(self) -> Iterator[tuple[TensorEntry, torch.Tensor]]:
        for future in as_completed(self._futures):
            entry, view = self._futures[future]
            exc = future.exception()
            if isinstance(exc, LoadError):
                raise exc
            if exc is not None:
                raise LoadError(f"{entry.file.name}: tensor {entry.name!r}: read failed: {exc}") from exc
            yield entry, view

    def close(self) -> None:
        """Cancel what has not started, wait for what has, close the files."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
