"""The ``inventory`` stage: the operator checklist of a model on a target.

Every aten operator of one prefill and one decode step is captured under a ``TorchDispatchMode`` (count,
input dtypes, the phases it appears in), then classified against the target's operator library:

* ``native``: a kernel is registered for the target's dispatch key (CPU, CUDA, PrivateUse1 …) in the
  installed torch, or the operator is listed in the hardware's ``operator_manifest``;
* ``decomposed``: torch's decomposition tables (core aten first, then the full table) rewrite it into
  operators that are native on the target (``decomposes_to`` lists them);
* ``fallback``: only a backend-agnostic kernel exists (CompositeExplicit/Implicit): it runs on the generic
  path, not on a target kernel;
* ``missing``: none of the above; the model cannot run this operator on the target.

The capture runs on the target device with random weights when the model fits comfortably in memory, else on
the ``meta`` device from the config alone (no weights, no data). On meta, data-dependent operators (``nonzero``,
``item``) cannot compute a value: they are recorded, and a stand-in of the largest possible shape is returned so
the trace continues — counts of such a trace are an upper bound for data-dependent branches (MoE expert loops).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from agents.pipeline.base import StageContext, StageFailed
from agents.pipeline.env import dispatch_key_for

STATUSES = ("native", "decomposed", "fallback", "missing")
PREFILL_TOKENS = 8
BLOCK_SIZE = 16
# a model whose weights exceed this share of free host memory (or 2 GiB) is traced on the meta device
_REAL_TRACE_MAX_BYTES = 2 * 1024**3
_GENERIC_KEYS = ("CompositeExplicitAutograd", "CompositeImplicitAutograd")
_aten = torch.ops.aten


# ---------------------------------------------------------------- capture


@dataclass
class OpRecord:
    count: int = 0
    dtypes: set[str] = field(default_factory=set)
    phases: set[str] = field(default_factory=set)
    sample: tuple[tuple, dict] | None = None  # meta copies of the first call's arguments


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _meta_stand_in(func: Any, args: tuple, kwargs: dict) -> Any:
    """A result for a data-dependent operator on meta tensors, or NotImplemented."""
    packet = func.overloadpacket
    if packet is _aten._local_scalar_dense:
        dtype = args[0].dtype
        return False if dtype == torch.bool else (0.0 if dtype.is_floating_point else 0)
    if packet in (_aten.nonzero,):
        x = args[0]
        return torch.empty((x.numel(), x.dim()), dtype=torch.long, device="meta")
    if packet is _aten.masked_select:
        return torch.empty((args[0].numel(),), dtype=args[0].dtype, device="meta")
    if packet in (_aten.bincount,):
        return torch.empty((int(kwargs.get("minlength", 0)) or args[0].numel(),), dtype=torch.long, device="meta")
    return NotImplemented


class OperatorRecorder(TorchDispatchMode):
    """Counts every aten operator that reaches the dispatcher below autograd, per phase."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[Any, OpRecord] = {}
        self.phase = "prefill"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        record = self.ops.get(func)
        if record is None:
            record = self.ops[func] = OpRecord()
            record.sample = (tree_map(_to_meta, args), tree_map(_to_meta, kwargs))
        record.count += 1
        record.phases.add(self.phase)
        for leaf in tree_flatten((args, kwargs))[0]:
            if isinstance(leaf, torch.Tensor):
                record.dtypes.add(_dtype_name(leaf.dtype))
        try:
            return func(*args, **kwargs)
        except (NotImplementedError, RuntimeError):
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            if not any(t.is_meta for t in tensors):
                raise
            if not all(t.is_meta for t in tensors):  # host-side layout tensors meet meta weights: move them over
                args, kwargs = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs))
                return func(*args, **kwargs)
            stand_in = _meta_stand_in(func, args, kwargs)
            if stand_in is NotImplemented:
                raise
            return stand_in


# ---------------------------------------------------------------- models and steps


def _materialize_decision(config: dict[str, Any], dtype: torch.dtype, device: str) -> tuple[bool, int, Any]:
    """(trace with real tensors?, weight bytes, the meta transformers model) from a meta build."""
    model = _transformers_model(config, dtype, "meta")
    n_bytes = sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()
    free = _free_memory_bytes(device) if _device_usable(device) else 0
    return n_bytes <= min(_REAL_TRACE_MAX_BYTES, free // 4), n_bytes, model


def _free_memory_bytes(device: str) -> int:
    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 1024**3


def _transformers_model(config: dict[str, Any], dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dict = dict(config)
    model_type = cfg_dict.pop("model_type", None)
    if not model_type:
        raise StageFailed("config.json has no 'model_type': cannot build the model for the operator inventory")
    try:
        hf_config = AutoConfig.for_model(model_type, **cfg_dict)
    except (KeyError, ValueError) as exc:
        raise StageFailed(f"transformers does not know model_type {model_type!r}: {exc}") from exc
    kwargs: dict[str, Any] = {"dtype": dtype}
    if torch.device(device).type == "meta":
        kwargs["experts_implementation"] = "eager"  # grouped_mm's meta kernel accepts bf16 only
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
        except (TypeError, ValueError):
            kwargs.pop("experts_implementation", None)
            model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
    return model.eval()


def _runtime_model(config: dict[str, Any], dtype: torch.dtype, device: str) -> Any | None:
    """The bundled runtime's model (native or fallback), or None when the registry is not available."""
    try:
        from agents.runtime.models.registry import build_model
    except ImportError:
        return None
    model = build_model(config, dtype=dtype, device=device)
    if torch.device(device).type != "meta":
        generator = torch.Generator(device="cpu").manual_seed(0)
        with torch.no_grad():
            for param in model.parameters() if hasattr(model, "parameters") else []:
                values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * 0.02
                param.copy_(values.to(param.dtype))
    return model


def _runtime_steps(model: Any, device: str, vocab: int, recorder: OperatorRecorder) -> None:
    """One paged prefill of ``PREFILL_TOKENS`` tokens and one decode step of the runtime model.

    On meta, the batch layout (``ForwardContext``) stays on CPU: the engine reads it on the host anyway."""
    from agents.runtime.context import ForwardContext

    layout = "cpu" if torch.device(device).type == "meta" else device

    spec = model.kv_cache_spec()
    n_blocks = (PREFILL_TOKENS + 1) // BLOCK_SIZE + 2
    if spec is not None:
        shape_tail = (spec.num_kv_heads, spec.head_dim) if spec.kind == "kv" else (spec.latent_dim,)
        per_layer = 2 if spec.kind == "kv" else 1
        caches = [
            tuple(torch.zeros((n_blocks, BLOCK_SIZE, *shape_tail), dtype=spec.dtype, device=device) for _ in range(per_layer))
            for _ in range(spec.num_layers)
        ]
        model.bind_kv_cache(caches)
    block_table = torch.arange(n_blocks, dtype=torch.int32, device=layout)[None]  # [1, n_blocks]
    ids = torch.randint(0, vocab, (PREFILL_TOKENS,), generator=torch.Generator().manual_seed(0)).to(device)  # [T]

    def step(tokens: torch.Tensor, start: int, decode: bool) -> torch.Tensor:
        n = int(tokens.shape[0])
        ctx = ForwardContext(
            cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device=layout),
            seqlens_k=torch.tensor([start + n], dtype=torch.int32, device=layout),
            max_seqlen_q=n,
            max_seqlen_k=start + n,
            slot_mapping=torch.arange(start, start + n, dtype=torch.int64, device=layout) if spec else None,
            block_tables=block_table if spec else None,
            is_decode=decode,
        )
        positions = torch.arange(start, start + n, dtype=torch.int64, device=device)  # [T]
        out = model.forward(tokens, positions, ctx)
        return model.compute_logits(out.hidden[-1:])  # [1, vocab]

    with torch.no_grad(), recorder:
        recorder.phase = "prefill"
        logits = step(ids, 0, decode=False)
        recorder.phase = "decode"
        next_id = logits.argmax(-1) if not logits.is_meta else ids[-1:]
        if spec is None:  # no cache: a decode step recomputes the whole sequence
            step(torch.cat([ids, next_id.to(ids.dtype)]), 0, decode=False)
        else:
            step(next_id.to(ids.dtype), PREFILL_TOKENS, decode=True)


def _transformers_steps(model: torch.nn.Module, device: str, vocab: int, recorder: OperatorRecorder) -> None:
    import inspect

    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.randint(0, vocab, (1, PREFILL_TOKENS), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad(), recorder:
        recorder.phase = "prefill"
        out = model(input_ids=ids, use_cache=True)
        recorder.phase = "decode"
        next_id = ids[:, -1:] if out.logits.is_meta else out.logits[:, -1:].argmax(-1)  # [1, 1]
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        model(input_ids=next_id, use_cache=True, **{cache_kw: cache})


def capture(config: dict[str, Any], *, dtype: str, device: str) -> tuple[OperatorRecorder, dict[str, Any]]:
    """Trace one prefill and one decode step; returns the recorder and how the trace was made."""
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise StageFailed(f"unknown dtype {dtype!r}")
    vocab = int(config.get("vocab_size") or 0)
    if vocab <= 0:
        raise StageFailed("config.json has no positive 'vocab_size'")
    real, weight_bytes, meta_model = _materialize_decision(config, torch_dtype, device)
    trace_device = device if real else "meta"
    info: dict[str, Any] = {"trace_device": trace_device, "weight_bytes": weight_bytes,
                            "prefill_tokens": PREFILL_TOKENS, "decode_tokens": 1}
    torch.manual_seed(0)
    recorder = OperatorRecorder()
    try:
        model = _runtime_model(config, torch_dtype, trace_device)
        if model is not None:
            _runtime_steps(model, trace_device, vocab, recorder)
            info["model_source"] = f"runtime-{getattr(model, 'path', 'native')}"
            return recorder, info
    except Exception as exc:  # noqa: BLE001 — the transformers trace below still gives the operator set
        info["runtime_trace_error"] = f"{type(exc).__name__}: {exc}"
        recorder = OperatorRecorder()
    model = meta_model if trace_device == "meta" else _transformers_model(config, torch_dtype, trace_device)
    _transformers_steps(model, trace_device, vocab, recorder)
    info["model_source"] = "transformers"
    return recorder, info


def _device_usable(device: str) -> bool:
    """Whether tensors can be allocated on ``device`` here (a CUDA target on a CPU host cannot)."""
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError):
        return False
    return True


# ---------------------------------------------------------------- classification


def _manifest_names(manifest: list[str] | None) -> set[str]:
    """Normalise manifest entries (``aten::mm``, ``aten.mm.default``, ``mm``) to ``mm`` and ``mm.default``."""
    names: set[str] = set()
    for entry in manifest or []:
        name = entry.strip().replace("::", ".").removeprefix("aten.")
        if name:
            names.add(name)
            names.add(name.split(".")[0] + ".default" if "." not in name else name)
    return names


class Classifier:
    """Classifies aten operators for one dispatch key and manifest, memoising decomposition traces."""

    def __init__(self, dispatch_key: str, manifest: list[str] | None = None, max_depth: int = 3,
                 trace_device: str | None = None) -> None:
        self.key = dispatch_key
        self.trace_device = trace_device  # where decompositions are traced; None: meta
        self.manifest = _manifest_names(manifest)
        self.max_depth = max_depth
        self._decomps = {**torch._decomp.decomposition_table, **torch._decomp.core_aten_decompositions()}
        self._cache: dict[Any, tuple[str, list[str]]] = {}

    def is_native(self, func: Any) -> bool:
        name = func.name()  # "aten::mm" or "aten::add.Tensor"
        short = name.split("::", 1)[-1]
        full = short if "." in short else f"{short}.default"
        if short.split(".")[0] in self.manifest or full in self.manifest:
            return True
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, self.key)

    def _materialize(self, value: Any) -> Any:
        """A meta sample argument as zeros on the trace device (so device-specific paths are taken), else meta."""
        if isinstance(value, torch.Tensor) and self.trace_device is not None and value.numel() <= 1 << 20:
            return torch.zeros(value.shape, dtype=value.dtype, device=self.trace_device)
        return _to_meta(value)

    def is_view(self, func: Any) -> bool:
        """Views and metadata-only ops: served by torch's backend-agnostic kernel, no device code runs."""
        returns = func._schema.returns
        aliases = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        return aliases and torch._C._dispatch_has_computed_kernel_for_dispatch_key(func.name(), self.key)

    def _trace_decomposition(self, func: Any, sample: tuple[tuple, dict]) -> dict[Any, OpRecord] | None:
        """The operators the decomposition of ``func`` calls on meta copies of a real call's arguments."""
        decomp = self._decomps.get(func)
        if decomp is None and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            decomp = func.decompose  # the generic kernel, written in other aten ops
        if decomp is None:
            return None
        args, kwargs = tree_map(self._materialize, sample)
        inner = OperatorRecorder()
        try:
            with inner:
                decomp(*args, **kwargs)
        except Exception:  # noqa: BLE001 — a decomposition that cannot run on meta tells us nothing
            return None
        return {op: rec for op, rec in inner.ops.items() if op != func}

    def classify(self, func: Any, sample: tuple[tuple, dict] | None, depth: int = 0) -> tuple[str, list[str]]:
        """(status, decomposes_to) of one operator; ``sample`` are meta arguments of a real call."""
        if func in self._cache:
            return self._cache[func]
        self._cache[func] = ("fallback", [])  # guards against a decomposition cycle
        result = self._classify(func, sample, depth)
        self._cache[func] = result
        return result

    def _classify(self, func: Any, sample: tuple[tuple, dict] | None, depth: int) -> tuple[str, list[str]]:
        if self.is_native(func) or self.is_view(func):
            return "native", []
        inner_ops = self._trace_decomposition(func, sample) if sample is not None else None
        if inner_ops and depth < self.max_depth:
            leaves: list[str] = []
            for op, rec in inner_ops.items():
                if self.is_native(op) or self.is_view(op):
                    leaves.append(str(op))
                    continue
                status, below = self.classify(op, rec.sample, depth + 1)
                if status != "decomposed":
                    break
                leaves.extend(below)
            else:
                return "decomposed", sorted(set(leaves))
        name = func.name()
        sibling = self._tensor_sibling(func)
        if sibling is not None and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd"):
            return "decomposed", [str(sibling)]
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in _GENERIC_KEYS):
            return "fallback", []
        return "missing", []

    def _tensor_sibling(self, func: Any) -> Any | None:
        """``add_.Scalar`` -> ``add_.Tensor``, ``arange.start`` -> ``arange.start_out``: the native overload a
        generic kernel of ``func`` calls, if the target has it."""
        overload = func._overloadname
        names = [overload.replace("Scalar", "Tensor")] if "Scalar" in overload else []
        # a functional op's generic kernel allocates the result and calls its out= variant
        names += [f"{overload}_out" if overload != "default" else "out", "out"]
        for name in names:
            sibling = getattr(func.overloadpacket, name, None)
            if sibling is not None and sibling is not func and self.is_native(sibling):
                return sibling
        return None


def classify_ops(
    recorder: OperatorRecorder,
    dispatch_key: str,
    manifest: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    trace_device: str | None = None,
) -> dict[str, Any]:
    """The ``ops`` list and ``summary`` of the inventory section."""
    classifier = Classifier(dispatch_key, manifest, trace_device=trace_device)
    ops: list[dict[str, Any]] = []
    items = sorted(recorder.ops.items(), key=lambda kv: str(kv[0]))
    for i, (func, record) in enumerate(items, 1):
        status, leaves = classifier.classify(func, record.sample)
        ops.append({
            "op": str(func),
            "count": record.count,
            "dtypes": sorted(record.dtypes),
            "status": status,
            "decomposes_to": leaves,
            "phases": [p for p in ("prefill", "decode") if p in record.phases],
        })
        if progress is not None:
            progress(i, len(items))
    summary = {status: sum(1 for op in ops if op["status"] == status) for status in STATUSES}
    return {"ops": ops, "summary": summary}


def run(ctx: StageContext) -> dict[str, Any]:
    """The ``inventory`` stage."""
    device = ctx.device
    try:
        key = dispatch_key_for(device)
    except ValueError as exc:
        raise StageFailed(str(exc)) from exc
    ctx.emit("log", f"tracing a prefill of {PREFILL_TOKENS} tokens and one decode step")
    try:
        recorder, info = capture(ctx.config, dtype=ctx.dtype, device=device)
    except StageFailed:
        raise
    except Exception as exc:  # noqa: BLE001 — any failure of the trace is the stage's evidence
        raise StageFailed(f"operator trace failed: {type(exc).__name__}: {exc}") from exc
    ctx.check_cancelled()
    total = len(recorder.ops)
    ctx.progress(0, total, "operators checked")

    def progress(done: int, n: int) -> None:
        if done == n or done % 8 == 0:
            ctx.progress(done, n, "operators checked")
            ctx.check_cancelled()

    trace_device = info["trace_device"] if info["trace_device"] != "meta" else None
    section = classify_ops(recorder, key, ctx.hardware.get("operator_manifest"), progress, trace_device)
    section.update(info, dispatch_key=key, device=device)
    s = section["summary"]
    ctx.emit("log", f"{total} operators: {s['native']} native, {s['decomposed']} decomposed, "
                    f"{s['fallback']} fallback, {s['missing']} missing")
    return section
