"""The module under test for the operator checks (``ops``): one runtime module with its parameters replaced by
random checkpoint-form values loaded through its own ``weight_loader`` (``Probe``), the metrics both sides are
compared with (``compare``), and the forward contexts the attention checks build."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from agents.pipeline.stages.align import refs as ref
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.op_capture import OperatorRecorder
from agents.runtime.context import ForwardContext
from agents.runtime.layers.fp8_native import is_native, load_rows, quantize_weight

TOKENS = 32
BLOCK_SIZE = 16
MAX_CHECK_ELEMENTS = 1 << 26  # a module with more parameters than this is too large to re-randomise here
_EPS = 1e-12
MAX_REL_ERR_DEFINITION = "max|ref - target| / max(max|ref|, 1e-12) over the tensor"


def compare(reference: torch.Tensor, out: torch.Tensor) -> dict[str, float]:
    """Cosine, max absolute and max (normwise) relative error of ``out`` against ``reference``."""
    if reference.shape != out.shape:
        raise StageFailed(f"shape mismatch: reference {tuple(reference.shape)} vs target {tuple(out.shape)}")
    a = reference.detach().to("cpu", torch.float64).flatten()
    b = out.detach().to("cpu", torch.float64).flatten()
    if not torch.isfinite(b).all():
        return {"cosine": float("nan"), "max_rel_err": float("inf"), "max_abs_err": float("inf")}
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    denom = a.norm().item() * b.norm().item()
    cosine = (a @ b).item() / denom if denom > 0 else (1.0 if diff == 0 else 0.0)
    return {"cosine": cosine, "max_rel_err": diff / max(a.abs().max().item(), _EPS), "max_abs_err": diff}


# ---------------------------------------------------------------- the module under test, re-randomised


@dataclass
class Probe:
    """One runtime module, its path in the model, and the random checkpoint tensors it was given."""

    path: str
    module: nn.Module
    config: dict[str, Any]
    device: torch.device
    dtype: torch.dtype  # the model's dtype: what the module receives in the model
    seed: int
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # for functional_call, the runtime's layout
    ckpt: dict[tuple[str, Any], torch.Tensor] = field(default_factory=dict)  # (param, shard) -> float64 values
    draws: int = 0
    aten: set[str] = field(default_factory=set)  # the aten operators the module's own code ran

    @contextlib.contextmanager
    def target(self) -> Iterator[None]:
        """Runs the module's code under a recorder: the operators the check exercised (the reference's math is
        never recorded)."""
        recorder = OperatorRecorder()
        with torch.inference_mode(), recorder:
            yield
        self.aten.update(str(op) for op in recorder.ops)

    def w(self, name: str, shard: Any = None) -> torch.Tensor | None:
        return self.ckpt.get((name, shard))

    def call(self, *args: Any, method: str = "forward") -> Any:
        with self.target():
            if method == "forward":
                return functional_call(self.module, self.params, args)
            with _swapped(self.module, self.params):
                return getattr(self.module, method)(*args)

    def input(self, *shape: int, scale: float = 1.0) -> tuple[torch.Tensor, ...]:
        """(target tensor on the device in the model's dtype, the same values in float64 on CPU)."""
        self.draws += 1
        g = torch.Generator().manual_seed(self.seed * 1000 + self.draws)
        value = (torch.randn(*shape, generator=g) * scale).to(self.dtype)
        return value.to(self.device), value.double()


def draw_checkpoint_tensor(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "e_score_correction_bias":
        return torch.randn(shape, generator=g) * 0.3  # large enough to change which experts a token picks
    if len(shape) == 1:
        return torch.randn(shape, generator=g) * 0.1 + (0.0 if leaf == "bias" else 1.0)  # biases ~0, norms ~1
    return torch.randn(shape, generator=g) * shape[-1] ** -0.5


def make_probe(path: str, module: nn.Module, config: dict[str, Any], dtype: torch.dtype, seed: int,
               device: torch.device | str | None = None) -> Probe:
    """The module with every parameter replaced by random checkpoint-form values loaded through its own
    ``weight_loader`` into a tensor of the parameter's dtype, device and strides (a column-major weight stays
    column-major, so the linear takes the path the model takes). ``device``: where its inputs go (default: where
    its parameters or buffers are; a module with neither, like attention, needs the model's)."""
    g = torch.Generator().manual_seed(seed)
    if device is None:
        held = [*module.parameters(), *module.buffers()]
        device = held[0].device if held else torch.device("cpu")
    probe = Probe(path, module, config, torch.device(device), dtype, seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            fresh = nn.Parameter(torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device),
                                 requires_grad=False)
            loader = getattr(p, "weight_loader", None)
            if is_native(p):  # native FP8: drawn per-channel FP8 with its scales (the reference: their product)
                fresh.fp8_scale = torch.ones_like(p.fp8_scale)
                for shard in p.shards:
                    values, scale = quantize_weight(draw_checkpoint_tensor(name, tuple(p.checkpoint_shape(shard)), g))
                    probe.ckpt[(name, shard)] = values.double() * scale.double()[:, None]
                    load_rows(p, fresh, values.to(p.device), scale.to(p.device), shard, loader)
                probe.params[name] = fresh
                continue
            for shard in getattr(p, "shards", [None]) if loader is not None else [None]:
                shape = tuple(p.checkpoint_shape(shard)) if loader is not None else tuple(p.shape)
                value = draw_checkpoint_tensor(name, shape, g).to(p.dtype)
                probe.ckpt[(name, shard)] = value.double()
                if loader is not None:
                    loader(fresh, value.to(p.device), shard)
                else:
                    fresh.copy_(value)
            probe.params[name] = fresh
    return probe


@contextlib.contextmanager
def _swapped(module: nn.Module, params: dict[str, torch.Tensor]) -> Iterator[None]:
    """The module's parameters replaced by ``params`` for a method other than ``forward``."""
    from torch.nn.utils.stateless import _reparametrize_module

    with _reparametrize_module(module, params):
        yield


@contextlib.contextmanager
def patched_attrs(obj: Any, **values: Any) -> Iterator[None]:
    """Set attributes for the duration (a cache bound to a module of the model), then put the old ones back."""
    old = {k: getattr(obj, k) for k in values}
    try:
        for k, v in values.items():
            setattr(obj, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


# ---------------------------------------------------------------- forward contexts


def attention_meta(ctx: ForwardContext, rotary: Any = None, positions: torch.Tensor | None = None,
          dtype: torch.dtype | None = None) -> Any:
    from agents.runtime.layers.attention import AttentionMetadata

    meta = AttentionMetadata.build(ctx)
    if rotary is not None:
        meta.cos, meta.sin = rotary.cos_sin(positions, int(positions.max()) + 1, dtype)
    return meta


def spread_positions(config: dict[str, Any], n: int) -> torch.Tensor:
    """Spread positions (large angles) within the model's context."""
    limit = max(n, min(int(config.get("max_position_embeddings") or 4096), 4096))
    return torch.arange(n, dtype=torch.int64) * 97 % limit


def rope_freqs(config: dict[str, Any], rotary: Any) -> tuple[torch.Tensor, float, str | None]:
    """The reference's inverse frequencies and cos/sin scaling, with a note when they come from the runtime."""
    freqs = ref.inv_freq(config, rotary.rotary_dim)
    if freqs is not None:
        return freqs, 1.0, None
    kind = ref.rope_parameters(config)["rope_type"]
    return rotary.inv_freq.detach().cpu().double(), float(rotary.scaling), (
        f"rope_type {kind!r}: frequencies taken from the runtime; rotation layout and application checked")


Row = dict[str, Any]


def report_row(op: str, probe: Probe, reference: torch.Tensor, out: torch.Tensor, **extra: Any) -> Row:
    return {"op": op, "module": type(probe.module).__name__, "where": probe.path, **compare(reference, out), **extra}


class Unchecked(Exception):
    """The check cannot run on this module; the message says why (the row becomes ``unchecked``)."""
