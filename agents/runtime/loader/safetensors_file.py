"""A safetensors file read by hand: the header is parsed and validated (8-byte length, JSON, known dtypes,
byte ranges inside the file and non-overlapping) before anything is memory-mapped."""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from agents.runtime.loader.memory import populate

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024


class LoadError(Exception):
    """A checkpoint cannot be loaded; the message names the file and, where there is one, the tensor."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> dict[str, TensorEntry]:
    """Validate one file's header and return its tensors (absolute offsets)."""
    where = path.name
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise LoadError(f"{where}: file of {size} bytes is too short for a safetensors header")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER, size - 8):
                raise LoadError(f"{where}: header length {length} runs past the file ({size} bytes): truncated?")
            raw = f.read(length)
    except OSError as exc:
        raise LoadError(f"{where}: cannot read: {exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoadError(f"{where}: header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise LoadError(f"{where}: header is not a JSON object")
    data_start, data_size = 8 + length, size - 8 - length
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _entry(where, path, name, info, data_start, data_size)
    ordered = sorted(entries.values(), key=lambda e: (e.start, e.end))
    for prev, cur in zip(ordered, ordered[1:], strict=False):
        if cur.start < prev.end:
            raise LoadError(f"{where}: tensor {cur.name!r} bytes [{cur.start}, {cur.end}) overlap tensor "
                            f"{prev.name!r} [{prev.start}, {prev.end})")
    return entries


def _entry(where: str, path: Path, name: str, info: object, data_start: int, data_size: int) -> TensorEntry:
    if not isinstance(info, dict):
        raise LoadError(f"{where}: tensor {name!r}: header entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPES:
        raise LoadError(f"{where}: tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise LoadError(f"{where}: tensor {name!r}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise LoadError(f"{where}: tensor {name!r}: bad data_offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise LoadError(f"{where}: tensor {name!r}: data_offsets {offsets} are not an ordered range")
    if end > data_size:
        raise LoadError(f"{where}: tensor {name!r}: bytes [{begin}, {end}) run past the end of the data "
                        f"({data_size} bytes): the file is truncated or the header is wrong")
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty((), dtype=DTYPES[dtype]).element_size()
    if numel * itemsize != end - begin:
        raise LoadError(f"{where}: tensor {name!r}: {end - begin} bytes do not hold shape {shape} of {dtype}")
    return TensorEntry(name, path, dtype, tuple(shape), data_start + begin, data_start + end)


class MappedFile:
    """A private (copy-on-write) mapping; tensors are zero-copy views, dropped from RSS after use unless a
    parameter adopted them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        size = os.fstat(self._fd).st_size
        self._mm = mmap.mmap(self._fd, size, access=mmap.ACCESS_COPY) if size else None
        self.keep = False  # some tensors became parameters: the mapping must outlive this object

    def tensor(self, entry: TensorEntry) -> torch.Tensor:
        return self.view(entry.start, entry.end, DTYPES[entry.dtype], entry.shape)

    def view(self, start: int, end: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """Bytes ``[start, end)`` of the file as a zero-copy tensor of ``shape`` (pages mapped in one call)."""
        if end == start:
            return torch.empty(shape, dtype=dtype)
        populate(self._mm, start, end)
        count = (end - start) // torch.empty((), dtype=dtype).element_size()
        return torch.frombuffer(self._mm, dtype=dtype, count=count, offset=start).view(shape)

    def release(self, start: int, end: int) -> None:
        """Drop the mapped pages of a byte range from this process (they stay in the page cache)."""
        if self._mm is None or end <= start:
            return
        page = mmap.PAGESIZE
        lo, hi = start // page * page, -(-end // page) * page
        hi = min(hi, len(self._mm))
        if hi > lo:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def close(self) -> None:
        """Unmap (unless parameters live in the mapping: they keep it alive) and close the descriptor."""
        if self._mm is not None and not self.keep:
            self._mm.close()
        self._mm = None
        os.close(self._fd)
