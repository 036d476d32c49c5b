"""Operator alignment (the ``align.ops`` list) on the runtime's own modules.

The model the load stage built is walked module by module (its *module inventory*); every module class it uses is
matched to a check, and each check runs **that instance's own forward** — its dense-linear path (oneDNN or MKL,
row- or column-major weights as the model stores them), its attention (no cache, paged prefill, paged decode), its
router class, its rotary layout, MLA, RMSNorm, SwiGLU and MoE experts — with its parameters swapped for fixed
random values (seed 0) through ``torch.func.functional_call``. The values are drawn in the checkpoint's own form
(q/k/v, gate/up, per-expert w1/w3/w2) and packed by the parameters' own ``weight_loader``; the reference
(``refs``) is float64 math written from the family's published definition and the model's ``config.json``,
fed those same checkpoint tensors. A module class with parameters (or a leaf) that no check covers is listed as
``unchecked``, never silently passed; the model on the transformers fallback has nothing of the runtime's own to
check and says so.

Inputs are drawn in float32, rounded once to the module's dtype, and both sides start from the rounded values.
Metrics per operator over the whole output (``a`` reference, ``b`` target, float64): ``cosine``; ``max_abs_err``;
``max_rel_err`` = ``max |a - b| / max(max |a|, eps)`` (normwise: elementwise ratios explode near zero). A router's
output is compared as the dense ``[tokens, experts]`` gate matrix (zero where an expert is not chosen), so a
different expert choice shows in the numbers; it also reports ``topk_agreement``, the share of tokens whose expert
set is the same on both sides. A disagreement where the reference's k-th and (k+1)-th scores are within
``near_tie_margin`` is a near-tie: that token is left out and does not fail the check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from agents.pipeline.stages.align.op_checks import (
    check_attention,
    check_embedding,
    check_experts,
    check_linear,
    check_mla,
    check_rms_norm,
    check_rope,
    check_router,
    check_self_attention,
    check_swiglu,
)
from agents.pipeline.stages.align.probe import MAX_CHECK_ELEMENTS, MAX_REL_ERR_DEFINITION, Row, Unchecked, make_probe
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.models import target_model
from contract.thresholds import OPS as OP_THRESHOLDS

DEFAULT_THRESHOLDS: dict[str, float] = OP_THRESHOLDS


# ---------------------------------------------------------------- the module inventory


def _checkers() -> list[tuple[type, str, Callable[..., list[Row]]]]:
    """(runtime class, check name, check) in matching order (subclasses match their base's check)."""
    from agents.runtime.layers.attention import Attention
    from agents.runtime.layers.embedding import VocabParallelEmbedding
    from agents.runtime.layers.grouped_router import GroupedTopKRouter
    from agents.runtime.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
    from agents.runtime.layers.mla import MLAttention
    from agents.runtime.layers.mlp import SwiGLUMLP
    from agents.runtime.layers.moe import RoutedExperts, TopKRouter
    from agents.runtime.layers.norm import RMSNorm
    from agents.runtime.layers.rotary import RotaryEmbedding
    from agents.runtime.layers.self_attention import SelfAttention

    return [
        (SelfAttention, "self_attention", check_self_attention),
        (MLAttention, "mla", check_mla),
        (Attention, "attention", check_attention),
        (SwiGLUMLP, "swiglu_mlp", check_swiglu),
        (GroupedTopKRouter, "router", check_router),
        (TopKRouter, "router", check_router),
        (RoutedExperts, "moe_experts", check_experts),
        (RMSNorm, "rms_norm", check_rms_norm),
        (RotaryEmbedding, "rope", check_rope),
        (VocabParallelEmbedding, "embedding", check_embedding),
        ((ColumnParallelLinear, RowParallelLinear, ReplicatedLinear), "linear", check_linear),
    ]


def module_inventory(model: nn.Module) -> tuple[list[tuple[str, nn.Module, str, Callable]], list[Row]]:
    """(one instance of every (check, class) the model uses, rows for the module classes no check covers).

    The instance taken is the one with the most parameters (the largest linear takes the oneDNN path if any
    does). Containers (modules with children and no parameters or buffers of their own) are not operators."""
    checkers = _checkers()
    chosen: dict[tuple[str, type], tuple[str, nn.Module, str, Callable]] = {}
    unchecked: dict[type, str] = {}
    for path, module in model.named_modules():
        for cls, name, fn in checkers:
            if isinstance(module, cls):
                key = (name, type(module))
                size = sum(p.numel() for p in module.parameters())
                if key not in chosen or size > sum(p.numel() for p in chosen[key][1].parameters()):
                    chosen[key] = (path, module, name, fn)
                break
        else:
            own = any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))
            leaf = not any(True for _ in module.children())
            if (own or leaf) and type(module) not in unchecked:
                unchecked[type(module)] = path
    rows = [{"op": type(m).__name__, "module": f"{type(m).__module__}.{type(m).__qualname__}", "where": unchecked[type(m)],
             "status": "unchecked", "cosine": None, "max_rel_err": None, "max_abs_err": None, "passed": None,
             "reason": "no operator check covers this runtime module"}
            for m in (dict(model.named_modules())[p] for p in unchecked.values())]
    return sorted(chosen.values(), key=lambda item: (item[2], item[0])), rows


def _label(row: Row) -> str:
    """A row's unique, readable name: the check, its phase, and for linears the layer class."""
    label = row["op"] + (f" {row['phase']}" if row.get("phase") else "")
    return f"{label} ({row['module']})" if row["op"] == "linear" else label


def _verdict(row: Row, th: dict[str, float]) -> Row:
    extra_ok = row.pop("_extra_ok", True)
    cosine, rel = row["cosine"], row["max_rel_err"]
    ok = cosine == cosine and cosine >= th["op_cosine"] and rel <= th["op_max_rel_err"] and extra_ok
    row["passed"] = bool(ok)
    row["status"] = "passed" if ok else "failed"
    return row


def run_checks(model: Any, config: dict[str, Any], *, thresholds: dict[str, float] | None = None,
               progress: Callable[[int, int], None] | None = None, seed: int = 0) -> list[Row]:
    """The ``align.ops`` rows for the runtime ``model`` (checked rows, then ``unchecked`` ones)."""
    th = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    if getattr(model, "path", "native") == "fallback" or not isinstance(model, nn.Module):
        return [{"op": "all operators", "module": type(model).__name__, "where": "", "status": "unchecked",
                 "cosine": None, "max_rel_err": None, "max_abs_err": None, "passed": None,
                 "reason": "the model runs on the transformers fallback: its operators are transformers' own code, "
                           "the same as the reference's; layers and end-to-end alignment still compare them"}]
    items, unchecked = module_inventory(model)
    first = next(model.parameters())
    dtype, device = getattr(model, "dtype", None) or first.dtype, first.device
    rows: list[Row] = []
    for i, (path, module, name, fn) in enumerate(items, 1):
        size = sum(p.numel() for p in module.parameters())
        base = {"op": name, "check": name, "module": type(module).__name__, "where": path}
        if size > MAX_CHECK_ELEMENTS:
            rows.append({**base, "status": "unchecked", "cosine": None, "max_rel_err": None, "max_abs_err": None,
                         "passed": None, "reason": f"{size:,} parameters: too large to re-randomise for the check"})
            continue
        try:
            probe = make_probe(path, module, config, dtype, seed + i, device)
            produced = fn(probe, th) if name == "router" else fn(probe)
        except Unchecked as exc:
            rows.append({**base, "status": "unchecked", "cosine": None, "max_rel_err": None, "max_abs_err": None,
                         "passed": None, "reason": str(exc)})
        except (KeyError, RuntimeError, ValueError, StageFailed) as exc:  # the module does not do what it must
            rows.append({**base, "status": "failed", "cosine": None, "max_rel_err": None, "max_abs_err": None,
                         "passed": False, "problem": f"{type(exc).__name__}: {exc}"})
        else:
            rows += [{**_verdict(row, th), "check": row["op"], "op": _label(row), "aten_ops": sorted(probe.aten)}
                     for row in produced]
        if progress:
            progress(i, len(items))
    return rows + unchecked


def run(ctx: StageContext) -> dict[str, Any]:
    """The operator part of the ``align`` section: ``{"ops": [...], "unchecked": [...], "passed", "thresholds"}``."""
    th = {**DEFAULT_THRESHOLDS, **{k: v for k, v in ctx.thresholds.items() if k in DEFAULT_THRESHOLDS}}
    model = target_model(ctx)
    config = ctx.config.get("text_config") or ctx.config  # a vision-language model: its decoder's operators
    ops = run_checks(model, config, thresholds=th,
                     progress=lambda done, total: ctx.progress(done, total, "operators aligned"))
    ctx.check_cancelled()
    checked = [op for op in ops if op["status"] != "unchecked"]
    section = {"ops": ops, "passed": bool(checked) and all(op["passed"] for op in checked), "thresholds": th,
               "unchecked": [op["op"] for op in ops if op["status"] == "unchecked"],
               "max_rel_err_definition": MAX_REL_ERR_DEFINITION}
    inventory = (ctx.results.get("inventory") or {}).get("ops")
    if isinstance(inventory, list):
        section["inventory_coverage"] = inventory_coverage(inventory, ops)
    return section


def inventory_coverage(inventory: list[dict[str, Any]], rows: list[Row]) -> dict[str, Any]:
    """Which of the inventory's aten operators the checks ran through the runtime's modules: ``exercised``
    (operator -> the checks that ran it) and ``not_exercised`` (operators of the model's trace no check ran,
    e.g. the sampler's ``argmax`` or the engine's index bookkeeping)."""
    by_op: dict[str, list[str]] = {}
    for row in rows:
        for name in row.get("aten_ops") or []:
            by_op.setdefault(name, []).append(row["op"])
    traced = sorted({str(op.get("op")) for op in inventory if isinstance(op, dict)})
    phases = {str(op.get("op")): op.get("phases") or [] for op in inventory if isinstance(op, dict)}
    missed = [name for name in traced if name not in by_op]
    # the portal asks a reason for each operator no check runs (its coverage rule, verdicts_align)
    reasons = {name: f"traced in the {' and '.join(phases[name]) or 'model'} pass outside every checked module "
                     "(the engine's sampling, cache or index bookkeeping); the layer and end-to-end comparisons "
                     "run it" for name in missed}
    return {"exercised": {name: sorted(set(by_op[name])) for name in traced if name in by_op},
            "not_exercised": missed, "not_exercised_reasons": reasons}
