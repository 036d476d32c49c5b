"""The ctypes mirror of ``csrc/day0_kernels.h``: every exported function's signature, the structs the Python side
fills (``DecodeLayer``), and the check that a library matches them before anything is bound.

The C side exports its ABI version (``day0_abi_version``) and the size of each mirrored struct
(``day0_struct_size``); ``mismatch`` compares both with this mirror and says in a sentence what differs, so a
library built from other headers (a stale prebuilt one, say) is refused instead of called with the wrong layout.
Change a signature or a struct in the header and ``ABI_VERSION`` goes up here and there together."""

from __future__ import annotations

import ctypes

ABI_VERSION = 10
MAX_HEAD_DIM, MAX_GROUP = 512, 32  # the C side's fixed buffers (DAY0_MAX_HEAD_DIM, DAY0_MAX_GROUP)

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class DecodeLayer(ctypes.Structure):
    """One decoder layer as ``day0_decode_layers`` reads it (``struct day0_layer``): raw addresses of its weights
    (panels) and caches, which the caller keeps alive, its shapes and its norms' epsilons."""

    _fields_ = [(name, _ptr) for name in ("in_norm", "post_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o", "o_bias",
                                          "k_cache", "v_cache", "gate_up", "down")] + [
        (name, _i64) for name in ("heads", "kv_heads", "head_dim", "rot", "inter", "window")] + [
        (name, _f32) for name in ("in_eps", "post_eps", "qk_eps", "scale")]


class DecodeComm(ctypes.Structure):
    """The shared-memory all-reduce as ``day0_decode_layers`` runs it on a tensor-parallel rank (``struct
    day0_comm``): the segment's address, every rank's process id, this rank's place, the sequence number (each
    call advances it), the poll and timeout; out: the rank found gone, the calls made and the seconds in them."""

    _fields_ = [("seg", _ptr), ("pids", _ptr), ("rank", _i64), ("world", _i64), ("slot", _i64), ("seq", _i64),
                ("poll_s", ctypes.c_double), ("timeout_s", ctypes.c_double), ("failed", _i64), ("calls", _i64),
                ("wait_s", ctypes.c_double)]


# ``day0_decode_layers``' results: done, a shape refused (nothing written), then a collective's failure mid-run
# (DAY0_COMM_* in the header)
DECODE_DONE, DECODE_REFUSED, COMM_ABANDONED, COMM_GONE, COMM_TIMEOUT = 0, -1, -2, -3, -4

# index of ``enum day0_struct`` -> (the C name, its mirror)
STRUCTS: dict[int, tuple[str, type[ctypes.Structure]]] = {0: ("struct day0_layer", DecodeLayer),
                                                           1: ("struct day0_comm", DecodeComm)}

# checked before the signatures are bound: a library too old to export them is refused by name
_CHECKS = {
    "day0_abi_version": ([], ctypes.c_int),
    "day0_struct_size": ([ctypes.c_int], _i64),
    "day0_source_digest": ([], ctypes.c_char_p),
    "day0_cpu_supported": ([], ctypes.c_int),
}

SIGNATURES = {
    **_CHECKS,
    "day0_vector_width": ([], ctypes.c_int),
    "day0_bind_threads": ([_ptr, ctypes.c_int], ctypes.c_int),
    "day0_rms_norm": ([_ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64, _f32], None),
    "day0_add_rms_norm": ([_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _f32], None),
    "day0_silu_and_mul": ([_ptr, _ptr, _i64, _i64], None),
    "day0_rotary": ([_ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64], None),
    "day0_paged_decode_attention": ([_ptr] * 6 + [_i64] * 7 + [_f32, _i64], ctypes.c_int),
    "day0_paged_prefill_attention": ([_ptr] * 8 + [_i64] * 7 + [_f32, _i64, _ptr, _i64], ctypes.c_int),
    "day0_prefill_key_chunk": ([], ctypes.c_int),
    "day0_argmax_rows": ([_ptr, _ptr, _i64, _i64], None),
    "day0_moe_experts": ([_ptr] * 6 + [_i64] * 5 + [_ptr, _ptr], ctypes.c_int),
    "day0_pack_panels": ([_ptr, _ptr, _i64, _i64, _i64], None),
    "day0_panel_linear": ([_ptr] * 4 + [_i64] * 5 + [_ptr], None),
    "day0_moe_panels": ([_ptr] * 6 + [_i64] * 5 + [_ptr, _ptr], ctypes.c_int),
    "day0_shm_allreduce": ([_ptr, _i64, _ptr], ctypes.c_int),
    "day0_decode_layers": ([_ptr, _ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64,
                            _ptr, _ptr], ctypes.c_int),
    "day0_decode_scratch": ([_ptr, _i64, _i64, _i64], _i64),
}


def mismatch(lib: ctypes.CDLL) -> str | None:
    """None when ``lib`` has this mirror's ABI version and struct sizes; else a sentence naming what differs."""
    missing = [name for name in _CHECKS if not hasattr(lib, name)]
    if missing:
        return f"the library exports no {', '.join(missing)}: it predates the ABI check (version {ABI_VERSION})"
    for name, (args, res) in _CHECKS.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    version = lib.day0_abi_version()
    if version != ABI_VERSION:
        return f"the library has ABI version {version}, the Python mirror {ABI_VERSION}"
    for index, (c_name, mirror) in STRUCTS.items():
        size = lib.day0_struct_size(index)
        if size != ctypes.sizeof(mirror):
            return f"{c_name} is {size} bytes in the library, {ctypes.sizeof(mirror)} in its mirror {mirror.__name__}"
    return None


def bind(lib: ctypes.CDLL) -> None:
    """Every exported function's argument and result types, from ``SIGNATURES`` (AttributeError for one missing)."""
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
