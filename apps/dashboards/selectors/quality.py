"""The cell's quantisation facts: the format and whether it runs native or emulated on this hardware (the plan's
and the load's ``quant`` blocks), and the "quality cost" of a quantised release: its newest eval against its
unquantised original's (``ModelRelease.quantized_from``), task by task with a 95 % bound (``contract.quality``).

The original's eval is taken on the same hardware when there is one, else its newest eval anywhere (labelled):
an unquantised release's task scores do not depend on the hardware beyond the tolerance its own eval checks."""

from __future__ import annotations

from typing import Any

from apps.catalog.models import Hardware, ModelRelease
from apps.evidence.models import StageResult
from contract.quality import quality_cost
from contract.quant_cost import problems as quant_cost_problems


def _section(result: StageResult | None) -> dict[str, Any]:
    if result is None:
        return {}
    raw = StageResult.objects.filter(pk=result.pk).values_list("section", flat=True).first()
    return raw if isinstance(raw, dict) else {}


def is_quantized(model: ModelRelease) -> bool:
    """A quantised release: its config names a quantisation, or the catalog links it to its original."""
    return bool((model.config or {}).get("quantization_config")) or model.quantized_from_id is not None


def quant_facts(model: ModelRelease, results: dict[str, StageResult]) -> dict[str, Any] | None:
    """``{format, mode, how, bytes, runtime_bytes, source}`` from the newest load's ``quant`` block (what ran), else
    the plan's (what the planner expects); None for an unquantised release (no query then)."""
    if not is_quantized(model):
        return None
    ids = {r.pk: stage for stage, r in results.items() if stage in ("load", "plan")}
    blocks = dict(StageResult.objects.filter(pk__in=list(ids)).values_list("stage", "section__quant"))  # one query
    for stage in ("load", "plan"):
        block = blocks.get(stage)
        if isinstance(block, dict) and block.get("format"):
            keep = ("format", "mode", "reason", "how", "bytes", "runtime_bytes", "types", "bits", "group")
            return {**{k: block.get(k) for k in keep}, "source": stage}
    return None


def _newest_eval(model: ModelRelease, hardware: Hardware | None) -> StageResult | None:
    rows = StageResult.objects.filter(job__model=model, stage="eval").select_related("job__hardware")
    if hardware is not None:
        rows = rows.filter(job__hardware=hardware)
    return rows.order_by("-created_at", "-id").defer("section").first()


def quality_cost_view(original: ModelRelease | None, hardware: Hardware,
                      results: dict[str, StageResult]) -> dict[str, Any] | None:
    """The quality-cost block of a quantised release's cell against ``original`` (None when the catalog knows no
    original, or the viewer may not see it: then None). Its rows are empty (with ``missing`` saying which side)
    while either eval is absent."""
    if original is None:
        return None
    mine = results.get("eval")
    theirs = _newest_eval(original, hardware)
    same_hardware = theirs is not None
    if theirs is None:
        theirs = _newest_eval(original, None)
    view: dict[str, Any] = {"original": original, "result": mine, "original_result": theirs,
                            "same_hardware": same_hardware, "rows": [], "missing": None}
    if mine is None or theirs is None:
        view["missing"] = "this release" if mine is None else "the original"
        return view
    view["rows"] = quality_cost(_section(mine).get("tasks") or [], _section(theirs).get("tasks") or [])
    view["worst"] = max(view["rows"], key=lambda r: r["cost"], default=None)
    return view


def original_e2e(results: dict[str, StageResult]) -> dict[str, Any] | None:
    """The newest align section's ``e2e_original`` block (the quantised release against its unquantised original
    end to end: greedy token match, KL, perplexity; informational, never failing align), with ``align_job_id``;
    None when that align measured none. A stored block out of its bounds is not shown (the ingest refuses one)."""
    align = results.get("align")
    if align is None:
        return None
    block = StageResult.objects.filter(pk=align.pk).values_list("section__e2e_original", flat=True).first()
    if not isinstance(block, dict) or quant_cost_problems(block):
        return None
    return {**block, "align_job_id": align.job_id}
