"""Classifying captured aten operators against a target's operator library: which dispatch key's kernel
serves each one on the device, and what that kernel runs.

For the target's dispatch key (CPU, CUDA, PrivateUse1 …) an operator is served by, in the dispatcher's order:
a kernel registered for that key (``served_by`` the key), a fallthrough passing it on, the operator's
CompositeImplicitAutograd kernel (its decomposition), its CompositeExplicitAutograd kernel (a backend-agnostic
kernel), or the key's catch-all backend fallback. A composite kernel is *run* on a sample of the operator's real
arguments — on the target device when tensors can live there, else on ``meta`` — through
``OpOverload.redispatch`` to the target key, under a recorder that sees every operator it calls:

* ``native``: a kernel registered for the key (or the operator listed in the hardware's ``operator_manifest``);
  also a view served by a composite kernel (metadata on its input's storage, no device code), and a composite
  kernel that calls no other operator yet ran to completion on the device itself (it reached the device's own
  code through a per-device stub, like ``copy_``);
* ``decomposed``: the composite kernel (or, when the key has nothing, torch's decomposition table) calls only
  operators that are themselves native or decomposed; ``decomposes_to`` lists the native leaves;
* ``fallback``: a generic path: the key's catch-all backend fallback, or a composite kernel that calls nothing
  else and could not be run on the device to show it does;
* ``missing``: nothing can run it on the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from agents.pipeline.support.op_capture import OperatorRecorder, to_meta

STATUSES = ("native", "decomposed", "fallback", "missing")
IMPLICIT = "CompositeImplicitAutograd"
EXPLICIT_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
MAX_SAMPLE_ELEMENTS = 1 << 20  # larger samples are re-run on meta


def manifest_names(manifest: list[str] | None) -> set[str]:
    """Normalise manifest entries (``aten::mm``, ``aten.mm.default``, ``mm``) to ``mm`` and ``mm.default``."""
    names: set[str] = set()
    for entry in manifest or []:
        name = entry.strip().replace("::", ".").removeprefix("aten.")
        if name:
            names.add(name)
            names.add(name.split(".")[0] + ".default" if "." not in name else name)
    return names


def _has(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


class Classifier:
    """Classifies aten operators for one dispatch key and manifest, memoising what each composite kernel calls.

    ``run_device``: where composite kernels are run on samples (None: the meta device)."""

    def __init__(self, dispatch_key: str, manifest: list[str] | None = None, max_depth: int = 4,
                 run_device: str | None = None, trace_device: str | None = None) -> None:
        self.key = dispatch_key
        self.keyset = torch._C.DispatchKeySet(torch._C._dispatch_key_parse(dispatch_key))
        self.run_device = run_device if run_device is not None else trace_device
        self.manifest = manifest_names(manifest)
        self.max_depth = max_depth
        self._decomps = {**torch._decomp.decomposition_table, **torch._decomp.core_aten_decompositions()}
        self._cache: dict[Any, dict[str, Any]] = {}

    # ---- what serves the key

    def in_manifest(self, func: Any) -> bool:
        short = func.name().split("::", 1)[-1]
        full = short if "." in short else f"{short}.default"
        return short.split(".")[0] in self.manifest or full in self.manifest

    def served_by(self, func: Any) -> str | None:
        """The registration that serves ``func`` on the key: the key itself, "manifest", a composite key,
        "backend fallback", or None when nothing does."""
        name = func.name()
        if self.in_manifest(func):
            return "manifest"
        if _has(name, self.key) and not torch._C._dispatch_kernel_for_dispatch_key_is_fallthrough(name, self.key):
            return self.key
        if _has(name, IMPLICIT):
            return IMPLICIT
        for key in EXPLICIT_KEYS:
            if _has(name, key):
                return key
        if torch._C._dispatch_has_backend_fallback(torch._C._dispatch_key_parse(self.key)):
            return "backend fallback"
        return None

    def is_native(self, func: Any) -> bool:
        """A kernel registered for the key (or listed in the manifest) serves it."""
        return self.served_by(func) in (self.key, "manifest")

    def is_view(self, func: Any) -> bool:
        """Returns only aliases of its inputs: metadata, no device code."""
        returns = func._schema.returns
        return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)

    # ---- running composite kernels

    def _materialize(self, value: Any) -> Any:
        """A meta sample argument as zeros on the run device (so its device-specific path is taken), else meta."""
        if isinstance(value, torch.Tensor) and self.run_device is not None and value.numel() <= MAX_SAMPLE_ELEMENTS:
            return torch.zeros(value.shape, dtype=value.dtype, device=self.run_device)
        if isinstance(value, torch.device) and self.run_device is None:
            return torch.device("meta")
        return to_meta(value)

    def _run(self, kernel: Callable[..., Any], sample: tuple[tuple, dict]) -> tuple[dict[Any, Any] | None, bool]:
        """(the operators ``kernel`` calls on the sample, whether it ran on the real device); None when it failed."""
        args, kwargs = tree_map(self._materialize, sample)
        if "device" in kwargs and self.run_device is not None:
            kwargs = {**kwargs, "device": torch.device(self.run_device)}
        on_device = self.run_device is not None and not any(
            isinstance(t, torch.Tensor) and t.is_meta for t in torch.utils._pytree.tree_flatten((args, kwargs))[0])
        inner = OperatorRecorder()
        try:
            with inner:
                kernel(*args, **kwargs)
        except Exception:  # noqa: BLE001 — a kernel that cannot run on this sample tells us nothing
            return None, False
        return inner.ops, on_device

    def _composite_calls(self, func: Any, sample: tuple[tuple, dict]) -> tuple[dict[Any, Any] | None, bool]:
        """Run the composite kernel that serves the key (``redispatch`` below the recorder, so what it calls is
        recorded); on meta samples the device argument goes to meta as well."""
        return self._run(lambda *a, **k: func.redispatch(self.keyset, *a, **k), sample)

    # ---- classification

    def classify(self, func: Any, sample: tuple[tuple, dict] | None, depth: int = 0) -> dict[str, Any]:
        """``{status, served_by, decomposes_to}`` of one operator; ``sample`` are meta arguments of a real call."""
        if func in self._cache:
            return self._cache[func]
        self._cache[func] = {"status": "fallback", "served_by": None, "decomposes_to": []}  # guards a cycle
        result = self._classify(func, sample, depth)
        self._cache[func] = result
        return result

    def _classify(self, func: Any, sample: tuple[tuple, dict] | None, depth: int) -> dict[str, Any]:
        served = self.served_by(func)
        if served in (self.key, "manifest"):
            return {"status": "native", "served_by": served, "decomposes_to": []}
        if served in (IMPLICIT, *EXPLICIT_KEYS) and sample is not None:
            calls, on_device = self._composite_calls(func, sample)
            if calls is not None:
                calls = {op: rec for op, rec in calls.items() if op != func}
                if self.is_view(func):  # what a view calls to alias its input (as_strided …) is metadata too
                    calls = {op: rec for op, rec in calls.items() if not self.is_view(op)}
                    if not calls:
                        return {"status": "native", "served_by": served, "decomposes_to": [], "kernel": "view"}
                if not calls:
                    if on_device:
                        return {"status": "native", "served_by": served, "decomposes_to": [],
                                "kernel": f"generic kernel ran on {self.run_device} (per-device stub)"}
                    return {"status": "fallback", "served_by": served, "decomposes_to": []}
                status, leaves = self._leaves(calls, depth)
                if status is not None:
                    return {"status": status, "served_by": served, "decomposes_to": leaves}
        elif served in (IMPLICIT, *EXPLICIT_KEYS) and self.is_view(func):
            return {"status": "native", "served_by": served, "decomposes_to": [], "kernel": "view"}
        if served is None or served == "backend fallback":
            table = self._decomps.get(func)
            if table is not None and sample is not None:
                calls, _ = self._run(table, sample)
                status, leaves = self._leaves(calls or {}, depth) if calls else (None, [])
                if status == "decomposed":
                    return {"status": "decomposed", "served_by": "decomposition table", "decomposes_to": leaves}
        if served is None:
            return {"status": "missing", "served_by": None, "decomposes_to": []}
        return {"status": "fallback", "served_by": served, "decomposes_to": []}

    def _leaves(self, calls: dict[Any, Any], depth: int) -> tuple[str | None, list[str]]:
        """("decomposed", native leaves) when every called operator is native or decomposed; ("missing", [])
        when one of them is missing; ("fallback", []) when one runs on a generic path; None past the depth."""
        if depth >= self.max_depth:
            return None, []
        leaves: set[str] = set()
        worst = "decomposed"
        for op, rec in calls.items():
            result = self.classify(op, rec.sample, depth + 1)
            if result["status"] == "native":
                leaves.add(str(op))
            elif result["status"] == "decomposed":
                leaves.update(result["decomposes_to"])
            elif result["status"] == "missing":
                return "missing", []
            else:
                worst = "fallback"
        return (worst, sorted(leaves)) if worst == "decomposed" else (worst, [])


def classify_ops(
    recorder: OperatorRecorder,
    dispatch_key: str,
    manifest: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    trace_device: str | None = None,
    *,
    model_path: str | None = None,
) -> dict[str, Any]:
    """The ``ops`` list and ``summary`` of the inventory section. ``trace_device``: where composite kernels run
    on samples (None: meta). With ``model_path == "fallback"`` the model ran on the transformers fallback, a
    generic path: every operator it calls that some kernel can run is ``fallback`` (``kernel_status`` keeps
    what the kernel alone would be)."""
    classifier = Classifier(dispatch_key, manifest, run_device=trace_device)
    ops: list[dict[str, Any]] = []
    items = sorted(recorder.ops.items(), key=lambda kv: str(kv[0]))
    for i, (func, record) in enumerate(items, 1):
        result = classifier.classify(func, record.sample)
        row = {
            "op": str(func),
            "count": record.count,
            "dtypes": sorted(record.dtypes),
            "status": result["status"],
            "decomposes_to": result["decomposes_to"],
            "served_by": result["served_by"],
            "phases": [p for p in ("prefill", "decode") if p in record.phases],
        }
        if "kernel" in result:
            row["kernel"] = result["kernel"]
        if model_path == "fallback" and row["status"] != "missing":
            row["kernel_status"], row["status"] = row["status"], "fallback"
        ops.append(row)
        if progress is not None:
            progress(i, len(items))
    summary = {status: sum(1 for op in ops if op["status"] == status) for status in STATUSES}
    return {"ops": ops, "summary": summary}
