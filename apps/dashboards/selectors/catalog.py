"""The model page (release, config summary, parameters, its row of cells, its Day-0 timeline) and the hardware
pages (the list; one hardware's specification, agents, collectives results and column of cells). A fixed
number of queries whatever the number of jobs or runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from apps.accounts.access import Actor
from apps.benchmarks.open_regressions import open_regressions
from apps.catalog.engines import version_key
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import visible_models, visible_models_q
from apps.dashboards.selectors.day0 import Day0Release, release_timeline
from apps.dashboards.selectors.fleet import fleet
from apps.evidence.models import StageResult
from apps.fleet.models import ONLINE_WINDOW
from apps.matrix.models import Cell
from contract.planner.memory import resolve_dtype

# (config key(s), label): the first key present wins (families name the same thing differently)
CONFIG_FACTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("architectures",), "architecture"), (("model_type",), "model type"),
    (("num_hidden_layers", "n_layer"), "layers"), (("hidden_size", "d_model"), "hidden size"),
    (("num_attention_heads",), "attention heads"), (("num_key_value_heads",), "KV heads"),
    (("head_dim",), "head dim"), (("intermediate_size",), "MLP size"),
    (("n_routed_experts", "num_local_experts", "num_experts"), "experts"),
    (("num_experts_per_tok", "moe_topk"), "experts per token"), (("n_shared_experts",), "shared experts"),
    (("kv_lora_rank",), "MLA KV rank"), (("vocab_size",), "vocabulary"),
    (("max_position_embeddings",), "context (config)"), (("torch_dtype", "dtype"), "stored dtype"),
)


def config_summary(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The config's headline numbers as (label, text); quantisation named when the checkpoint has one."""
    facts = []
    for keys, label in CONFIG_FACTS:
        value = next((config[k] for k in keys if config.get(k) not in (None, "", [])), None)
        if value is not None:
            facts.append((label, ", ".join(map(str, value)) if isinstance(value, list) else
                          f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)))
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant:
        facts.append(("quantization", str(quant.get("quant_method") or quant.get("bits") or "yes")))
    return facts


@dataclass
class ModelPage:
    model: ModelRelease
    own_format: str  # the checkpoint's own format, as the planner reads it (fp8, mxfp4, bf16 …)
    facts: list[tuple[str, str]]
    cells: list[tuple[Hardware, Cell | None, list[str]]]
    timeline: Day0Release


def engine_rows(cells: QuerySet[Cell], by: str) -> dict[int, list[Cell]]:
    """Cells grouped by ``by`` (their hardware or model id), each group's engines the bundled runtime first,
    then by name and version: the model and hardware pages show one row per engine."""
    out: dict[int, list[Cell]] = {}
    for cell in cells.select_related("engine"):
        out.setdefault(getattr(cell, by), []).append(cell)
    for group in out.values():
        group.sort(key=lambda c: (not c.engine.default, c.engine.name, version_key(c.engine.version)))
    return out


def model_page(actor: Actor, slug: str) -> ModelPage | None:
    """None when the model is unknown or not visible to ``actor``."""
    model = visible_models(actor).select_related("organization").filter(slug=slug).first()
    if model is None:
        return None
    hardware = list(Hardware.objects.order_by("vendor", "name"))
    cells = engine_rows(Cell.objects.filter(model=model), "hardware_id")
    regressions = open_regressions(actor, model=model.slug)
    timeline = release_timeline(model, hardware, {(model.pk, hw_id): (c[0].tier, c[0].failed_stage,
                                                                      c[0].tier_reached_at)
                                                  for hw_id, c in cells.items() if c[0].engine.default})
    try:
        own_format = resolve_dtype("auto", model.config or {})[0]
    except ValueError:
        own_format = model.dtype
    return ModelPage(model, own_format, config_summary(model.config or {}),
                     [(h, cell, regressions.get((model.slug, h.slug), [])) for h in hardware
                      for cell in cells.get(h.pk) or [None]], timeline)


@dataclass
class HardwarePage:
    hardware: Hardware
    agents: list[Any]
    cells: list[tuple[ModelRelease, Cell | None, list[str]]]
    collectives: list[dict[str, Any]] = field(default_factory=list)


def hardware_list() -> list[tuple[Hardware, int, int]]:
    """Every hardware with its agent count and online agent count (one query)."""
    rows = Hardware.objects.annotate(
        agent_count=Count("agents"),
        online=Count("agents", filter=Q(agents__last_heartbeat_at__gte=timezone.now() - ONLINE_WINDOW)),
    ).order_by("vendor", "name")
    return [(h, h.agent_count, h.online) for h in rows]


def hardware_page(actor: Actor, slug: str) -> HardwarePage | None:
    hardware = Hardware.objects.select_related("organization").filter(slug=slug).first()
    if hardware is None:
        return None
    models = list(ModelRelease.objects.filter(visible_models_q(actor)).only(
        "id", "slug", "name", "released_at", "visibility", "family", "params_total", "params_active"))
    cells = engine_rows(Cell.objects.filter(hardware=hardware, model_id__in=[m.pk for m in models]), "model_id")
    regressions = open_regressions(actor, hardware=hardware.slug)
    comm = (StageResult.objects.filter(job__hardware=hardware, stage="comm",
                                       job__model_id__in=[m.pk for m in models])
            .order_by("-created_at", "-id").values("job_id", "passed", "created_at", "section")[:5])
    collectives = []
    for row in comm:
        section = row["section"] if isinstance(row["section"], dict) else {}
        for c in section.get("collectives") or []:
            if not isinstance(c, dict):
                continue
            sizes = [s for s in c.get("sizes") or [] if isinstance(s, dict)]
            best = max((s.get("busbw_gbps") or 0 for s in sizes), default=None)
            collectives.append({"job": row["job_id"], "at": row["created_at"], "ranks": section.get("ranks"),
                                "op": c.get("op"), "dtype": c.get("dtype"), "ok": c.get("ok"), "busbw": best,
                                "sizes": len(sizes)})
    return HardwarePage(hardware, fleet(actor, hardware_id=hardware.pk),
                        [(m, cell, regressions.get((m.slug, hardware.slug), [])) for m in models
                         for cell in cells.get(m.pk) or [None]],
                        collectives)
