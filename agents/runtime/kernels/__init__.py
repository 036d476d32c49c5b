"""The runtime's fused fp32 CPU kernels (``cpu_kernels.c``): RMSNorm, residual add + RMSNorm, SiLU-and-mul,
in-place RoPE, decode attention read straight from the paged KV cache, prefill attention of every prompt
(or chunk) of a step over that cache in one call, the greedy argmax of the logits, the
routed SwiGLU experts of a MoE layer in one call, and a decode step through a run of decoder layers in one call
(``decode_layers``).

The C file is compiled once per (source, compiler, CPU flags) with the system C compiler into
``$DAY0_KERNEL_CACHE`` (default ``~/.cache/day0/kernels``) and loaded with ctypes, which releases the GIL
for the call. Nothing else is needed: no torch headers, no build step at install. Where it cannot be built
(no compiler, another OS or CPU architecture) or is turned off (``DAY0_NATIVE_KERNELS=0``), ``available()``
is False and every layer runs its torch code, which is also the reference the kernels are tested against.
The vectors are the CPU's own width (16 lanes with AVX-512, 8 with AVX2, 4 otherwise; ``status()`` says which);
``DAY0_KERNEL_CFLAGS`` adds compiler flags (``-mno-avx512f`` builds the AVX2 code on an AVX-512 host).
Each wrapper takes tensors the layers already hold and says False/None when the case is not one it covers
(dtype, device, layout), so the caller falls back."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
ABI_VERSION = 7
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11", "-fno-math-errno"]
MAX_HEAD_DIM, MAX_GROUP = 512, 32  # the C file's fixed buffers
PRUNE_DAYS = 30  # libraries of other sources unused this long are removed when a new one is built

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_state = "unloaded"  # unloaded | loaded | unavailable
_lanes = 0  # floats per vector of the loaded build
_key_chunk = 0  # keys per chunk of the prefill attention (its transposed keys are kept in chunks of this many)
_reason = ""

_c_int64, _c_float, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_dispatch_modes = torch._C._len_torch_dispatch_stack  # > 0 while a TorchDispatchMode is active (0.1 us a call)
_SIGNATURES = {
    "day0_abi_version": ([], ctypes.c_int),
    "day0_vector_width": ([], ctypes.c_int),
    "day0_bind_threads": ([_ptr, ctypes.c_int], ctypes.c_int),
    "day0_rms_norm": ([_ptr, _ptr, _ptr, _c_int64, _c_int64, _c_int64, _c_int64, _c_int64, _c_float], None),
    "day0_add_rms_norm": ([_ptr, _ptr, _ptr, _ptr, _ptr, _c_int64, _c_int64, _c_float], None),
    "day0_silu_and_mul": ([_ptr, _ptr, _c_int64, _c_int64], None),
    "day0_rotary": ([_ptr, _ptr, _ptr, _c_int64, _c_int64, _c_int64, _c_int64, _c_int64], None),
    "day0_paged_decode_attention": ([_ptr] * 6 + [_c_int64] * 7 + [_c_float, _c_int64], ctypes.c_int),
    "day0_paged_prefill_attention": ([_ptr] * 8 + [_c_int64] * 7 + [_c_float, _c_int64, _ptr, _c_int64],
                                     ctypes.c_int),
    "day0_prefill_key_chunk": ([], ctypes.c_int),
    "day0_argmax_rows": ([_ptr, _ptr, _c_int64, _c_int64], None),
    "day0_moe_experts": ([_ptr] * 6 + [_c_int64] * 5 + [_ptr, _ptr], ctypes.c_int),
    "day0_pack_panels": ([_ptr, _ptr, _c_int64, _c_int64, _c_int64], None),
    "day0_panel_linear": ([_ptr] * 4 + [_c_int64] * 5 + [_ptr], None),
    "day0_moe_panels": ([_ptr] * 6 + [_c_int64] * 5 + [_ptr, _ptr], ctypes.c_int),
    "day0_shm_allreduce": ([_ptr, _c_int64, _ptr, _c_int64, _c_int64, _c_int64, _c_int64, ctypes.c_double],
                           ctypes.c_int),
    "day0_decode_layers": ([_ptr, _ptr, _c_int64, _ptr, _ptr, _c_int64, _c_int64, _c_int64, _ptr, _ptr, _ptr, _ptr,
                            _ptr, _c_int64, _c_int64, _ptr], ctypes.c_int),
    "day0_decode_scratch": ([_ptr, _c_int64, _c_int64, _c_int64], _c_int64),
}
PANEL = 16  # outputs per weight panel (``pack_panels``)


def cache_dir() -> Path:
    return Path(os.environ.get("DAY0_KERNEL_CACHE") or Path.home() / ".cache" / "day0" / "kernels")


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_key() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _flags() -> list[str]:
    return [*FLAGS, *shlex.split(os.environ.get("DAY0_KERNEL_CFLAGS", ""))]


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = _flags()
    key = hashlib.sha256("\0".join([SOURCE.read_text(), cc, version, " ".join(flags), _cpu_key()]).encode())
    target = cache_dir() / f"day0_cpu_kernels-{key.hexdigest()[:16]}.so"
    if target.exists():
        _touch(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(cc).name} failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
        os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _prune(target)
    return target


def _touch(path: Path) -> None:
    """A library's mtime is its last use (the cache may be read-only: then it is left as it is)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _prune(keep: Path) -> None:
    """Each edit of the source, compiler or CPU leaves a library behind: those unused for PRUNE_DAYS go when a
    new one is built (one still loaded by a running process stays mapped; it is only unlinked)."""
    horizon = time.time() - PRUNE_DAYS * 86400
    for old in keep.parent.glob("day0_cpu_kernels-*.so"):
        try:
            if old != keep and old.stat().st_mtime < horizon:
                old.unlink()
        except OSError:
            pass


def _load() -> None:
    global _key_chunk, _lanes, _lib, _state, _reason
    if os.environ.get("DAY0_NATIVE_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        _state, _reason = "unavailable", "turned off by DAY0_NATIVE_KERNELS"
        return
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64", "aarch64"):
        _state, _reason = "unavailable", f"not built for {platform.system()} {platform.machine()}"
        return
    cc = _compiler()
    if cc is None:
        _state, _reason = "unavailable", "no C compiler (cc, gcc or clang) on PATH"
        return
    try:
        torch.get_num_threads()  # torch (and its OpenMP runtime, which the library then shares) is loaded
        lib = ctypes.CDLL(str(_build(cc)))
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        if lib.day0_abi_version() != ABI_VERSION:
            raise RuntimeError(f"ABI version {lib.day0_abi_version()} != {ABI_VERSION}")
    except Exception as exc:  # any failure leaves the torch code in charge, said once
        _state, _reason = "unavailable", f"{type(exc).__name__}: {exc}"
        log.warning("native CPU kernels unavailable (%s); the layers run their torch code", _reason)
        return
    _lib, _state, _reason, _lanes, _key_chunk = lib, "loaded", "", lib.day0_vector_width(), lib.day0_prefill_key_chunk()
    log.info("native CPU kernels loaded")


def available() -> bool:
    """True when the library is built and loaded (building it on first call)."""
    if _state == "unloaded":
        with _lock:
            if _state == "unloaded":
                _load()
    return _state == "loaded"


def status() -> dict[str, object]:
    """loaded, the reason it is not, and the vector lanes of the build (None when not loaded)."""
    available()
    return {"loaded": _state == "loaded", "reason": _reason or None,
            "vector_width": _lib.day0_vector_width() if _state == "loaded" else None}


def _ok(*tensors: torch.Tensor) -> bool:
    """The library is loaded, nothing traces the ops (torch.compile fuses these ops itself and cannot trace a
    ctypes call; a dispatch mode, such as the pipeline's operator inventory, must see the model's own aten ops)
    and every tensor is an fp32 CPU tensor (cheap checks: this runs per layer call)."""
    if _state != "loaded" and not available() or torch.compiler.is_compiling() or _dispatch_modes():
        return False
    f32 = torch.float32
    return all(t.is_cpu and t.dtype is f32 for t in tensors)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` as a new contiguous tensor, for x of 2 or 3 dims whose last
    dim is contiguous (a view of heads inside a row is fine); None when not covered."""
    if not _ok(x, weight) or x.stride(-1) != 1:
        return None
    if x.dim() == 2:
        outer, inner, so, si = x.shape[0], 1, x.stride(0), 0
    elif x.dim() == 3:
        outer, inner, so, si = x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    else:
        return None
    out = torch.empty(x.shape, dtype=torch.float32)
    _lib.day0_rms_norm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), outer, inner, x.shape[-1], so, si, eps)
    return out


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(h = x + delta, rms_norm(h) * weight), both new [T, N] tensors; None when not covered."""
    if not _ok(x, delta, weight) or x.dim() != 2 or x.shape != delta.shape or not (x.is_contiguous() and
                                                                          delta.is_contiguous()):
        return None
    h, normed = torch.empty_like(x), torch.empty_like(x)
    _lib.day0_add_rms_norm(h.data_ptr(), normed.data_ptr(), x.data_ptr(), delta.data_ptr(), weight.data_ptr(),
                           x.shape[0], x.shape[1], eps)
    return h, normed


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """``silu(x[:, :I]) * x[:, I:]`` for a contiguous [T, 2I] x; None when not covered."""
    if not _ok(x) or x.dim() != 2 or not x.is_contiguous() or x.shape[1] % 2:
        return None
    rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, inter)
    _lib.day0_silu_and_mul(out.data_ptr(), x.data_ptr(), rows, inter)
    return out


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> bool:
    """Rotate-half RoPE of ``x [T, heads, D]`` in place (heads contiguous in a row; rows strided), with the
    rotary tables as ``RotaryEmbedding.cos_sin`` returns them ([T, 1, 2, rot/2], contiguous); False when not
    covered."""
    if not _ok(x, cos, sin) or x.dim() != 3 or x.stride(2) != 1 or x.stride(1) != x.shape[2] or rot % 2 or (
            rot > x.shape[2] or cos.numel() != x.shape[0] * rot or sin.numel() != cos.numel()):
        return False
    _lib.day0_rotary(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0], x.shape[1], x.shape[2], x.stride(0),
                     rot)
    return True


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                           seqlens: torch.Tensor, scale: float, window: int | None) -> torch.Tensor | None:
    """Attention of one query token per sequence over its cached keys: ``q [B, H, D]`` (rows may be strided,
    heads contiguous), caches ``[blocks, block_size, Hkv, D]``, block tables ``[B, width]`` and key counts
    ``[B]`` (int32) -> ``[B, H * D]``; None when not covered."""
    b, heads, d = q.shape
    kv_heads = k_cache.shape[2]
    if (not _ok(q, k_cache, v_cache) or q.stride(2) != 1 or q.stride(1) != d or not k_cache.is_contiguous()
            or not v_cache.is_contiguous() or tables.dtype is not torch.int32 or seqlens.dtype is not torch.int32
            or not tables.is_contiguous() or not seqlens.is_contiguous() or d > MAX_HEAD_DIM
            or heads % kv_heads or heads // kv_heads > MAX_GROUP or not tables.is_cpu):
        return None
    out = torch.empty(b, heads * d)
    rc = _lib.day0_paged_decode_attention(
        out.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), seqlens.data_ptr(),
        b, heads, kv_heads, d,
        k_cache.shape[1], tables.shape[1], q.stride(0), scale, window or 0)
    return out if rc == 0 else None


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                            bounds: torch.Tensor, scale: float, window: int | None) -> torch.Tensor | None:
    """Causal attention of every sequence's new queries over its cached keys (stored before the call): ``q [T, H,
    D]`` (rows may be strided, heads contiguous), caches ``[blocks, block_size, Hkv, D]``, block tables ``[B,
    width]`` and ``bounds [3, B]`` (int32: each sequence's first row of q, its new queries, the last positions of
    its ``k_len`` keys; 0 new queries: the sequence is skipped) -> ``[T, H * D]``, the skipped rows unset. None
    when not covered (the head dimension must be a whole number of vectors)."""
    t, heads, d = q.shape
    kv_heads = k_cache.shape[2]
    if (not _ok(q, k_cache, v_cache) or q.stride(2) != 1 or q.stride(1) != d or not k_cache.is_contiguous()
            or not v_cache.is_contiguous() or tables.dtype is not torch.int32 or bounds.dtype is not torch.int32
            or not tables.is_contiguous() or not bounds.is_contiguous() or not tables.is_cpu or not bounds.is_cpu
            or bounds.dim() != 2 or bounds.shape != (3, tables.shape[0]) or d > MAX_HEAD_DIM or d % _lanes
            or heads % kv_heads or heads // kv_heads > MAX_GROUP):
        return None
    out = torch.empty(t, heads * d)
    n = bounds.shape[1]
    # every key of the sequences with new queries transposed once, in whole chunks: at most one partial a sequence
    floats = (int(bounds[2].sum()) + n * _key_chunk) * kv_heads * d
    keys_t = _thread_buffer("attn_keys", floats, torch.float32)
    base = bounds.data_ptr()
    rc = _lib.day0_paged_prefill_attention(
        out.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), base, base + 4 * n,
        base + 8 * n, n, heads, kv_heads, d, k_cache.shape[1], tables.shape[1], q.stride(0), scale, window or 0,
        keys_t.data_ptr(), keys_t.numel())
    return out if rc == 0 else None


def bind_threads(cpus: list[int]) -> bool:
    """Pin the calling thread's OpenMP team (``len(cpus)`` threads, the caller first) one thread to a CPU, for
    every later parallel region of this thread, torch's included; True when every thread was pinned. False when
    the library is not loaded (nothing is pinned then)."""
    if not cpus or not available():
        return False
    ids = torch.tensor(cpus, dtype=torch.int32)
    return _lib.day0_bind_threads(ids.data_ptr(), len(cpus)) == len(cpus)


def shm_allreduce(x: torch.Tensor, segment: int, rank: int, world: int, slot: int, seq: int, budget_s: float) -> int:
    """One call of the shared-memory all-reduce (``day0_shm_allreduce``) on contiguous fp32 CPU ``x`` of at most
    ``slot`` elements, over the segment at address ``segment``: 0 done, -1 a rank still missing after
    ``budget_s`` (call again with the same ``seq``), -2 a rank abandoned. The caller (``distributed``) owns the
    segment and the sequence; the library must be loaded."""
    return _lib.day0_shm_allreduce(x.data_ptr(), x.numel(), segment, rank, world, slot, seq, budget_s)


def argmax_rows(x: torch.Tensor) -> list[int] | None:
    """``x.argmax(-1).tolist()`` for contiguous fp32 ``[N, V]`` logits (the first maximum of each row); None when
    not covered, or when a row holds a NaN (torch's argmax then decides)."""
    if not _ok(x) or x.dim() != 2 or not x.is_contiguous() or x.shape[1] == 0:
        return None
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _lib.day0_argmax_rows(out.data_ptr(), x.data_ptr(), x.shape[0], x.shape[1])
    picks = out.tolist()
    return None if -1 in picks else picks


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor | None:
    """Routed SwiGLU experts with every expert local and whole: ``x [T, H]``, ``w13 [E, 2I, H]`` (gate rows, then
    up rows), ``w2 [E, H, I]``, routing ``ids [T, k]`` and ``weights [T, k]`` -> ``[T, H]``, each token's expert
    terms added in ascending expert order (as the grouped path adds them); None when not covered."""
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or ids.dim() != 2 or ids.shape != weights.shape:
        return None
    t, h = x.shape
    e, two_i, h13 = w13.shape
    inter = two_i // 2
    if (h13 != h or two_i % 2 or tuple(w2.shape) != (e, h, inter) or ids.shape[0] != t or ids.dtype is not torch.int64
            or not _ok(x, w13, w2, weights) or not ids.is_cpu
            or not all(z.is_contiguous() for z in (x, w13, w2, ids, weights))):
        return None
    pairs = ids.numel()
    out = torch.empty(t, h)
    scratch = torch.empty(pairs * (inter + h))
    work = torch.empty(2 * e + 1 + 2 * pairs, dtype=torch.int64)
    rc = _lib.day0_moe_experts(out.data_ptr(), x.data_ptr(), w13.data_ptr(), w2.data_ptr(), ids.data_ptr(),
                               weights.data_ptr(), t, ids.shape[1], e, h, inter, scratch.data_ptr(), work.data_ptr())
    return out if rc == 0 else None


def pack_panels(w: torch.Tensor) -> torch.Tensor | None:
    """A 2-D fp32 weight ``[N, K]`` (rows contiguous) as panels ``[ceil(N / 16), K, 16]``: ``wp[p, k, c] =
    w[16 p + c, k]``, the rows past N zero; the layout ``panel_linear`` streams. None when not covered."""
    if not _ok(w) or w.dim() != 2 or w.stride(1) != 1 or w.shape[0] == 0:
        return None
    n, k = w.shape
    wp = torch.empty((-(-n // PANEL), k, PANEL), dtype=torch.float32)
    _lib.day0_pack_panels(wp.data_ptr(), w.data_ptr(), n, k, w.stride(0))
    return wp


def pack_expert_panels(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Stacked SwiGLU experts ``w13 [E, 2I, H]`` (gate rows, then up rows) and ``w2 [E, H, I]`` as the panels
    ``moe_panels`` streams: ``[E, 2 ceil(I/16), H, 16]`` (each expert's gate panels, then its up panels, each
    half padded with zero rows) and ``[E, ceil(H/16), I, 16]``. None when not covered."""
    if not _ok(w13, w2) or w13.dim() != 3 or w2.dim() != 3 or not (w13.is_contiguous() and w2.is_contiguous()):
        return None
    e, two_i, h = w13.shape
    inter = two_i // 2
    if two_i % 2 or inter == 0 or h == 0 or tuple(w2.shape) != (e, h, inter):
        return None
    gp, hp = -(-inter // PANEL), -(-h // PANEL)
    w13p = torch.empty((e, 2 * gp, h, PANEL), dtype=torch.float32)
    w2p = torch.empty((e, hp, inter, PANEL), dtype=torch.float32)
    for i in range(e):
        _lib.day0_pack_panels(w13p[i, :gp].data_ptr(), w13[i, :inter].data_ptr(), inter, h, h)
        _lib.day0_pack_panels(w13p[i, gp:].data_ptr(), w13[i, inter:].data_ptr(), inter, h, h)
        _lib.day0_pack_panels(w2p[i].data_ptr(), w2[i].data_ptr(), h, inter, inter)
    return w13p, w2p


def unpack_expert_panels(w13p: torch.Tensor, w2p: torch.Tensor, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The stacked ``(w13 [E, 2I, H], w2 [E, H, I])`` back from ``pack_expert_panels``' panels, in torch ops (new
    tensors): for the code paths that read the plain layout (a tracer, other dtypes)."""
    e, two_gp, h, _ = w13p.shape
    gp = two_gp // 2
    rows = w13p.reshape(e, 2, gp, h, PANEL).permute(0, 1, 2, 4, 3).reshape(e, 2, gp * PANEL, h)[:, :, :inter]
    down = w2p.permute(0, 1, 3, 2).reshape(e, -1, inter)[:, :h]
    return rows.reshape(e, 2 * inter, h), down.contiguous()


def moe_panels(x: torch.Tensor, w13p: torch.Tensor, w2p: torch.Tensor, inter: int, ids: torch.Tensor,
               weights: torch.Tensor) -> torch.Tensor | None:
    """``moe_experts`` over the panels of ``pack_expert_panels`` (``inter`` = I): ``x [T, H]``, routing ``ids
    [T, k]`` and ``weights [T, k]`` -> ``[T, H]``, each token's expert terms added in ascending expert order and
    every product one multiply-add chain over k (a token's result is the same whatever it is batched with); any
    number of rows per expert. None when not covered."""
    if x.dim() != 2 or w13p.dim() != 4 or w2p.dim() != 4 or ids.dim() != 2 or ids.shape != weights.shape:
        return None
    t, h = x.shape
    e, two_gp, h13, lanes = w13p.shape
    gp, hp = -(-inter // PANEL), -(-h // PANEL)
    if (inter < 1 or h13 != h or lanes != PANEL or two_gp != 2 * gp or tuple(w2p.shape) != (e, hp, inter, PANEL)
            or ids.shape[0] != t or ids.dtype is not torch.int64 or not _ok(x, w13p, w2p, weights) or not ids.is_cpu
            or not all(z.is_contiguous() for z in (x, w13p, w2p, ids, weights))):
        return None
    pairs = ids.numel()
    rows = pairs + (PANEL - 1) * e  # each expert's rows padded to whole tiles
    out = torch.empty(t, h)
    # kept per thread: a fresh 30+ MB buffer per prefill layer was mmapped and faulted in on every call
    scratch = _thread_buffer("moe", rows * (h + inter) + pairs * h, torch.float32)
    work = _thread_buffer("moe_work", 10 * e + 9 * pairs + 3, torch.int64)
    rc = _lib.day0_moe_panels(out.data_ptr(), x.data_ptr(), w13p.data_ptr(), w2p.data_ptr(), ids.data_ptr(),
                              weights.data_ptr(), t, ids.shape[1], e, h, inter, scratch.data_ptr(), work.data_ptr())
    return out if rc == 0 else None


_scratch = threading.local()  # each calling thread's buffer for the re-laid rows of x (the server calls from one)


def _thread_buffer(name: str, elements: int, dtype: torch.dtype) -> torch.Tensor:
    """The calling thread's buffer ``name`` of at least ``elements`` (grown, never shrunk)."""
    buf = getattr(_scratch, name, None)
    if buf is None or buf.numel() < elements:
        buf = torch.empty(max(elements, 1 << 16), dtype=dtype)
        setattr(_scratch, name, buf)
    return buf


def _rows_scratch(elements: int) -> torch.Tensor:
    return _thread_buffer("buf", elements, torch.float32)


def panel_linear(x: torch.Tensor, wp: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """``x W^T (+ bias)`` for ``x [M, K]`` (rows contiguous) and ``W [n, K]`` packed by ``pack_panels`` ->
    ``[M, n]``; every output one multiply-add chain over k in order, the same whatever M or the thread count.
    None when not covered."""
    extra = () if bias is None else (bias,)
    if not _ok(x, wp, *extra) or x.dim() != 2 or x.stride(1) != 1 or wp.dim() != 3 or (
            wp.shape[1:] != (x.shape[1], PANEL) or not wp.is_contiguous() or n < 1 or -(-n // PANEL) != wp.shape[0]):
        return None  # n must need exactly these panels: the last one holds 1..16 of the outputs
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        return None
    m, k = x.shape
    y = torch.empty((m, n), dtype=torch.float32)
    xp = _rows_scratch((m + PANEL - 1) * k).data_ptr() if m > 1 else 0  # tiles of <= 16 rows; one row in place
    _lib.day0_panel_linear(y.data_ptr(), x.data_ptr(), wp.data_ptr(), 0 if bias is None else bias.data_ptr(), m, n,
                           k, x.stride(0), n, xp)
    return y


class DecodeLayer(ctypes.Structure):
    """One decoder layer as ``day0_decode_layers`` reads it (``struct day0_layer``): raw addresses of its weights
    (panels) and caches, which the caller keeps alive, its shapes and its norms' epsilons."""

    _fields_ = [(name, _ptr) for name in ("in_norm", "post_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o", "o_bias",
                                          "k_cache", "v_cache", "gate_up", "down")] + [
        (name, _c_int64) for name in ("heads", "kv_heads", "head_dim", "rot", "inter", "window")] + [
        (name, _c_float) for name in ("in_eps", "post_eps", "qk_eps", "scale")]


def decode_scratch(layers: ctypes.Array, hidden: int, batch: int) -> int:
    """Floats of scratch ``decode_layers`` needs for ``layers`` at ``batch`` rows (the C side's own count); -1
    when the kernel does not take the layers."""
    return _lib.day0_decode_scratch(ctypes.addressof(layers), len(layers), hidden, batch)


def decode_layers(x: torch.Tensor, delta: torch.Tensor, has_delta: bool, normed: torch.Tensor, layers: ctypes.Array,
                  cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor,
                  seqlens: torch.Tensor, block_size: int) -> bool:
    """A decode step through ``layers`` (a ``DecodeLayer`` array: every layer but the last with its MLP) in one
    call. ``x [B, hidden]`` (the residual stream, updated in place), ``delta [B, hidden]`` (the previous MLP's
    output still to add when ``has_delta``; this run's last MLP output on return), ``normed [B, hidden]`` (the last
    layer's post-attention norm when it has no MLP here). The caller checked the tensors (contiguous fp32 CPU,
    rotary tables ``[B, 1, 2, rot/2]``, int64 ``slots [B]``, int32 ``tables [B, width]`` and ``seqlens [B]``).
    False when the kernel does not take the shapes (nothing written then)."""
    floats = decode_scratch(layers, x.shape[1], x.shape[0])
    if floats < 0:
        return False
    scratch = _thread_buffer("decode_layers", floats, torch.float32)
    rc = _lib.day0_decode_layers(x.data_ptr(), delta.data_ptr(), int(has_delta), normed.data_ptr(),
                                 ctypes.addressof(layers), len(layers), x.shape[0], x.shape[1], cos.data_ptr(),
                                 sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), seqlens.data_ptr(), block_size,
                                 tables.shape[1], scratch.data_ptr())
    return rc == 0
