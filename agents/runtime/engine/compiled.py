"""The compiled path (``day0 serve --compile``): the native decoder layers compiled with ``torch.compile``
(Inductor, ``dynamic=True`` over the step's token count), beside the eager path on the same weights.

What is compiled: one decoder layer's forward (``DecoderLayer.forward``: norms, QKV and output projections,
QK-norm, RoPE, the MLP, the MoE router and shared experts). Every layer of a model has the same code and
structure, so Dynamo compiles that region once per shape class (a step of one token, a step of several) and
every layer reuses it: the compile time does not grow with depth. What stays eager, as opaque custom ops
inside the compiled graph:

* paged attention (``day0::paged_attention``): the batch layout lives in Python lists (each sequence's query
  bounds, the mixed prefill/decode split) and the op writes the paged KV cache with ``index_copy_``; MLA
  (DeepSeek-V3) runs as a whole block (``day0::whole_attention``: projections, latent cache write, attention);
* routed experts (``day0::routed_experts``): their per-expert token counts are read on the host.

Inside the graph both are calls that take and return tensors whose only dynamic size is the token count, so a
new batch layout (other sequence lengths, another mix of prefills and decodes) never recompiles. The step's
``AttentionMetadata`` reaches the attention op through this module's step slot, set by each layer's wrapper
just before the compiled region runs; the op finds its layer by a one-element key tensor of that layer (an
argument, so the graph has no per-layer constant and stays shared; the KV cache itself is no graph input, so
the pool's size, which follows the free memory at start, never changes the graph or its cache key).

``CompileStats`` records what the compiled path cost and did: compile seconds (the calls that compiled
something, the warm-up's), graphs, graph breaks with their reasons, recompiles after the warm-up with Dynamo's
guard-failure reasons, and the hits and misses of Inductor's FX graph cache and the AOT autograd cache (on a
second start with the same cache directory the graphs come from the cache). Inductor's CPU backend compiles
C++: ``check_cpp_compiler`` says clearly when no compiler answers."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

CACHE_ENV = "DAY0_COMPILE_CACHE_DIR"
CACHE_COUNTERS = (  # (counters group, key): the compilation caches' outcomes
    ("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_bypass"),
    ("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"),
    ("aot_autograd", "autograd_cache_bypass"), ("aot_autograd", "autograd_cache_saved"),
)
MAX_REASONS = 10  # graph-break and recompile reasons kept (each cut to REASON_CHARS)
REASON_CHARS = 300


class CompileUnavailable(RuntimeError):
    """The compiled path cannot run here (no C++ compiler for Inductor on CPU, an unsupported model)."""


def default_cache_dir() -> Path:
    """``$DAY0_COMPILE_CACHE_DIR``, else ``$DAY0_DATA_DIR/compile-cache``, else ``var/compile-cache`` of the repo."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    data = os.environ.get("DAY0_DATA_DIR")
    return (Path(data) if data else Path(__file__).resolve().parents[3] / "var") / "compile-cache"


def configure_caches(cache_dir: str | Path | None = None) -> Path:
    """Point Inductor's caches at ``cache_dir`` (``TORCHINDUCTOR_CACHE_DIR``) and turn the FX graph cache and
    the AOT autograd cache on. Call before the first compile of the process."""
    path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path.resolve())
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return path.resolve()


def check_cpp_compiler() -> str:
    """The C++ compiler Inductor's CPU backend calls, with its version line; ``CompileUnavailable`` naming
    what to install when none answers ``--version``."""
    from torch._inductor import cpp_builder, exc

    try:
        cxx = cpp_builder.get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        raise CompileUnavailable(
            "torch.compile on CPU (Inductor) needs a C++ compiler, and none was found: g++ (or $CXX) does not "
            "answer --version. Install one (Debian/Ubuntu: apt-get install g++) or set CXX to its path."
        ) from None
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{cxx}: {version.splitlines()[0]}" if version.strip() else cxx


def _check_triton(device: torch.device) -> str:
    """Inductor on a GPU generates Triton kernels: ``CompileUnavailable`` when Triton is not installed."""
    from torch.utils._triton import has_triton

    if not has_triton():
        raise CompileUnavailable(f"torch.compile on {device.type} (Inductor) needs Triton, which is not installed "
                                 "for this torch (pip install triton, matching the torch build)")
    import triton

    return f"triton {triton.__version__}"


# ---- the opaque ops ------------------------------------------------------------------------------------------

class _Step(threading.local):
    meta: Any = None  # the running layer's AttentionMetadata


_STEP = _Step()
_ATTENTION: dict[int, nn.Module] = {}  # a layer key's data_ptr -> its Attention module
_EXPERTS: dict[int, tuple[nn.Module, Callable[..., torch.Tensor]]] = {}  # w13 data_ptr -> (module, eager forward)
_ORIGINAL = "_day0_eager_forward"  # attribute keeping a patched module's eager forward
_KEY = "_day0_layer_key"  # a one-element tensor per attention layer: the op's handle on its layer


@torch.library.custom_op("day0::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_key: torch.Tensor) -> torch.Tensor:
    """The eager paged attention of the layer ``layer_key`` names, on the step's metadata: writes the new K/V
    into the paged cache (``index_copy_``) and attends. q: [T, H, D], k/v: [T, Hkv, D] -> [T, H * D]. The
    cache write is a side effect the graph does not see: nothing in the compiled region reads the cache, and
    the cache is no input of the graph (its pool size, set by the free memory at start, would change the
    graph's shapes and so its key in the FX graph cache)."""
    attn = _ATTENTION[layer_key.data_ptr()]
    return getattr(attn, _ORIGINAL)(q, k, v, _STEP.meta)


@paged_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_key: torch.Tensor) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))


@torch.library.custom_op("day0::whole_attention", mutates_args=())
def whole_attention(hidden: torch.Tensor, layer_key: torch.Tensor) -> torch.Tensor:
    """A whole attention block run eager (MLA: its projections, latent cache write and attention in one
    forward) on the step's metadata. hidden: [T, hidden] -> [T, hidden]."""
    block = _ATTENTION[layer_key.data_ptr()]
    return getattr(block, _ORIGINAL)(hidden, _STEP.meta)


@whole_attention.register_fake
def _(hidden: torch.Tensor, layer_key: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(hidden)


@torch.library.custom_op("day0::routed_experts", mutates_args=())
def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
    """The eager routed experts owning ``w13`` (their forward pre-hooks included: the expert-load counters).
    x: [T, H], weights/ids: [T, k] -> this rank's partial sum [T, H]."""
    _module, forward = _EXPERTS[w13.data_ptr()]
    return forward(x, weights, ids)


@routed_experts.register_fake
def _(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _patch_attention(attn: nn.Module, device: torch.device, *, whole: bool = False) -> None:
    """``attn`` becomes an opaque op under Dynamo: the paged ``Attention`` (q, k, v, meta), or with ``whole`` a
    whole attention block (hidden, meta), such as MLA's."""
    eager = attn.forward
    setattr(attn, _ORIGINAL, eager)
    key = torch.zeros(1, device=device)  # same shape in every layer: the shared graph takes it as an input
    setattr(attn, _KEY, key)
    _ATTENTION[key.data_ptr()] = attn

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: Any) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return paged_attention(q, k, v, getattr(attn, _KEY))
        return eager(q, k, v, meta)

    def forward_whole(hidden: torch.Tensor, meta: Any) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return whole_attention(hidden, getattr(attn, _KEY))
        return eager(hidden, meta)

    attn.forward = forward_whole if whole else forward


_HOOKS = "_day0_pre_hooks"  # the forward pre-hooks moved off a patched experts module


def _patch_experts(experts: nn.Module) -> None:
    """Routed experts become the opaque op under Dynamo. Their forward pre-hooks (the expert-load counters,
    which take a lock) move into the forward itself, so Dynamo never traces them: they run in the op."""
    module_forward = experts.forward
    hooks = list(experts._forward_pre_hooks.items())
    experts._forward_pre_hooks.clear()
    setattr(experts, _HOOKS, hooks)

    def eager(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        for _key, hook in hooks:
            hook(experts, (x, weights, ids))
        return module_forward(x, weights, ids)

    def forward(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return routed_experts(x, weights, ids, experts.w13)
        return eager(x, weights, ids)

    setattr(experts, _ORIGINAL, module_forward)
    _EXPERTS[experts.w13.data_ptr()] = (experts, eager)
    experts.forward = forward


@contextmanager
def inductor_gemms() -> Iterator[None]:
    """Inside the compiled region the linears call ``F.linear`` and Inductor picks the GEMM: the eager path's
    direct oneDNN call (``layers/linear.py``, ``mkldnn._linear_pointwise``) lowers only on frozen weights, and
    freezing would bake one layer's weights into the region every layer shares. The switch is a module flag
    read while Dynamo traces; Dynamo guards on it, so it must hold the same value on every compiled call."""
    from agents.runtime.layers import linear

    saved = getattr(linear, "_ONEDNN", None)
    if saved is None:
        yield
        return
    linear._ONEDNN = False
    try:
        yield
    finally:
        linear._ONEDNN = saved


# ---- statistics ----------------------------------------------------------------------------------------------

def _counter_snapshot() -> dict[str, int]:
    from torch._dynamo.utils import counters

    snap = {f"{group}.{key}": int(counters[group][key]) for group, key in CACHE_COUNTERS}
    snap["graphs"] = int(counters["stats"]["unique_graphs"])
    snap["graph_breaks"] = int(sum(counters["graph_break"].values()))
    return snap


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass
class CompileStats:
    """What the compiled path did in this process (``report()`` is the server's ``/stats/compile`` body)."""

    backend: str = "inductor"
    dynamic: bool = True
    device: str = "cpu"
    cache_dir: str | None = None
    compiler: str | None = None
    compiled_region: str = "DecoderLayer.forward"
    layers: int = 0
    compile_seconds: float = 0.0
    compiling_calls: int = 0
    steps: int = 0
    warm: bool = False  # the warm-up is over: any graph compiled later is a recompile in service
    recompiles_after_warmup: int = 0
    baseline: dict[str, int] = field(default_factory=dict)
    warmup_counts: dict[str, int] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def deltas(self) -> dict[str, int]:
        now = _counter_snapshot()
        return {k: now[k] - self.baseline.get(k, 0) for k in now}

    def report(self) -> dict[str, Any]:
        from torch._dynamo.utils import counters, guard_failures

        d = self.deltas()
        breaks = sorted(counters["graph_break"].items(), key=lambda kv: -kv[1])[:MAX_REASONS]
        reasons = [str(r)[:REASON_CHARS] for failures in guard_failures.values() for r in failures][:MAX_REASONS]
        return {
            "enabled": True,
            "backend": self.backend,
            "dynamic": self.dynamic,
            "device": self.device,
            "compiled_region": self.compiled_region,
            "layers": self.layers,
            "compiler": self.compiler,
            "cache_dir": self.cache_dir,
            "compile_seconds": round(self.compile_seconds, 3),
            "compiling_calls": self.compiling_calls,
            "steps": self.steps,
            "graphs": d["graphs"],
            "graph_breaks": d["graph_breaks"],
            "graph_break_reasons": [{"reason": str(r)[:REASON_CHARS], "count": int(n)} for r, n in breaks],
            "recompiles_after_warmup": self.recompiles_after_warmup,
            "recompile_reasons": reasons,
            "cache": {
                "fxgraph_hit": d["inductor.fxgraph_cache_hit"],
                "fxgraph_miss": d["inductor.fxgraph_cache_miss"],
                "fxgraph_bypass": d["inductor.fxgraph_cache_bypass"],
                "aot_autograd_hit": d["aot_autograd.autograd_cache_hit"],
                "aot_autograd_miss": d["aot_autograd.autograd_cache_miss"],
                "aot_autograd_bypass": d["aot_autograd.autograd_cache_bypass"],
                "aot_autograd_saved": d["aot_autograd.autograd_cache_saved"],
            },
            "warmup": self.warmup_counts,
        }


# ---- installing the compiled path ----------------------------------------------------------------------------

def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    from agents.runtime.layers.attention import Attention
    from agents.runtime.models.decoder import DecoderLayer

    layers = list(getattr(model, "stage_layers", []) or [])
    if not layers or not all(type(layer) is DecoderLayer for layer in layers):
        raise CompileUnavailable(
            f"{type(model).__name__} is not a native decoder of DecoderLayer blocks: the compiled path covers "
            "the native families (the transformers fallback runs eager)")
    if not all(isinstance(getattr(layer.self_attn, "attn", None), Attention) or _is_mla(layer.self_attn)
               for layer in layers):
        raise CompileUnavailable(f"{type(model).__name__}: the compiled path covers paged GQA attention and MLA "
                                 "layers")
    return layers


def _is_mla(module: nn.Module) -> bool:
    from agents.runtime.layers.mla import MLAttention

    return isinstance(module, MLAttention)


def _attention_of(layer: nn.Module) -> nn.Module:
    """What runs eager as an op: the paged ``Attention`` inside the block, or the whole MLA block."""
    return layer.self_attn if _is_mla(layer.self_attn) else layer.self_attn.attn


class CompiledModel:
    """The compiled path installed on a built model: its decoder layers run the compiled region, the rest of
    the forward (metadata, embedding, final norm, logits) stays eager. ``enabled`` False runs the eager
    layers again (the same model compared both ways)."""

    def __init__(self, model: nn.Module, *, device: torch.device | str = "cpu",
                 cache_dir: str | Path | None = None) -> None:
        self.model = model
        self.device = torch.device(device)
        if torch.distributed.is_available() and torch.distributed.is_initialized() and (
                torch.distributed.get_world_size() > 1):
            raise CompileUnavailable("the compiled path serves one process (tp, pp and ep 1): the collectives of "
                                     "a multi-rank step run eager for now")
        self.layers = _decoder_layers(model)
        compiler = check_cpp_compiler() if self.device.type == "cpu" else _check_triton(self.device)
        cache = configure_caches(cache_dir)
        self.stats = CompileStats(device=str(self.device), cache_dir=str(cache), compiler=compiler,
                                  layers=len(self.layers), baseline=_counter_snapshot())
        self.enabled = True
        from agents.runtime.models.decoder import DecoderLayer

        self._region = torch.compile(DecoderLayer.forward, dynamic=True, backend="inductor")
        for layer in self.layers:
            self._install(layer)
        self._wrap_model_forward()
        model.prune_last_layer = False  # the last layer runs the compiled region on every row, as the others
        model.native_decode = False  # every step runs the compiled region (the native decode would bypass it)

    def _install(self, layer: nn.Module) -> None:
        if hasattr(layer, _ORIGINAL):
            raise CompileUnavailable("the compiled path is already installed on this model")
        attn = _attention_of(layer)
        _patch_attention(attn, self.device, whole=_is_mla(attn))
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None and hasattr(experts, "w13"):
            _patch_experts(experts)
        eager = layer.forward
        setattr(layer, _ORIGINAL, eager)
        region = self._region

        def forward(x: torch.Tensor, meta: Any) -> torch.Tensor:
            if not self.enabled:
                return eager(x, meta)
            _STEP.meta = meta
            try:
                with inductor_gemms():
                    return region(layer, x, meta)
            finally:
                _STEP.meta = None

        layer.forward = forward

    def _wrap_model_forward(self) -> None:
        """Wrap the model's ``forward`` to time the calls that compile and count steps."""
        eager_forward = self.model.forward
        stats = self.stats

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return eager_forward(*args, **kwargs)
            before = _graphs()
            started = time.perf_counter()
            out = eager_forward(*args, **kwargs)
            compiled = _graphs() - before
            with stats._lock:
                stats.steps += 1
                if compiled:
                    stats.compile_seconds += time.perf_counter() - started
                    stats.compiling_calls += 1
                    if stats.warm:
                        stats.recompiles_after_warmup += compiled
            return out

        self.model.forward = forward

    def mark_warm(self) -> None:
        """The warm-up is done: later graphs count as recompiles in service."""
        self.stats.warm = True
        self.stats.warmup_counts = self.stats.deltas()

    def remove(self) -> None:
        """Restore the eager forwards and hooks (the model is then as it was built)."""
        for layer in self.layers:
            attn = _attention_of(layer)
            key = attn.__dict__.pop(_KEY, None)
            if key is not None:
                _ATTENTION.pop(key.data_ptr(), None)
            for module in (layer, attn, getattr(layer.mlp, "experts", None)):
                if module is None or not hasattr(module, _ORIGINAL):
                    continue
                delattr(module, _ORIGINAL)
                module.__dict__.pop("forward", None)
                for key, hook in module.__dict__.pop(_HOOKS, []):
                    module._forward_pre_hooks[key] = hook
                if module is not layer and module is not attn:
                    _EXPERTS.pop(module.w13.data_ptr(), None)
        self.model.__dict__.pop("forward", None)
        self.model.prune_last_layer = True
        from agents.runtime.models.native_decode import native_decode_enabled

        self.model.native_decode = native_decode_enabled()
