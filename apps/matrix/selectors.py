"""Read-side queries of the matrix, shared by the page and the API. A constant number of queries whatever the
number of models, hardware or jobs: models, hardware, cells (one query each)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from django.db.models import Q

from apps.accounts.access import Actor
from apps.catalog.engines import parse_engine_filter, version_key
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import visible_models_q
from apps.matrix.models import Cell
from contract.engines import DEFAULT_ENGINE
from contract.tiers import TIER_NAMES

# lead_hours is stored on the cell: parsing 8,000 timestamps per request would cost more than the rest
CELL_COLUMNS = ("model_id", "hardware_id", "tier", "failed_stage", "fits", "fits_devices", "lead_hours", "job_count",
                "current_tier_reached_at", "fits_plan__dtype", "tier_reached_at", "custom_thresholds", "synthetic",
                "disputed", "engine__name", "engine__version", "engine__default", "fits_plan__quant__mode",
                "fits_plan__quant__reason")


def parse_tier(raw: str | None) -> int | None:
    """A ``?tier=`` parameter: 0-6 or a tier name; None when blank. Raises ``ValueError`` naming what is accepted."""
    raw = (raw or "").strip()
    if not raw:
        return None
    if raw.isdecimal() and int(raw) in TIER_NAMES:  # isdecimal: int() accepts it ("²" is a digit, not a decimal)
        return int(raw)
    by_name = {name: level for level, name in TIER_NAMES.items()}
    if raw in by_name:
        return by_name[raw]
    raise ValueError(f"must be 0-6 or a tier name ({', '.join(TIER_NAMES.values())})")


class FilterError(ValueError):
    """A bad matrix filter; ``field`` names the parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class MatrixFilters:
    vendor: str = ""
    family: str = ""
    min_tier: int | None = None
    engine: str = ""  # NAME (every version) or NAME@VERSION: only that engine's cells; "" = the best engine's

    @classmethod
    def from_params(cls, params: Any, *, strict: bool = False) -> MatrixFilters:
        """``?vendor=&family=&tier=&engine=`` (tier: the minimum tier a row must reach on some hardware; engine:
        ``NAME`` or ``NAME@VERSION``). A bad tier or engine raises ``FilterError`` when ``strict`` (the API), and
        is ignored otherwise (pages keep working)."""
        try:
            tier = parse_tier(params.get("tier"))
        except ValueError as exc:
            if strict:
                raise FilterError("tier", str(exc)) from None
            tier = None
        engine = (params.get("engine") or "").strip()[:140]
        try:
            parse_engine_filter(engine)
        except ValueError as exc:
            if strict:
                raise FilterError("engine", str(exc)) from None
            engine = ""
        return cls(vendor=(params.get("vendor") or "").strip(), family=(params.get("family") or "").strip(),
                   min_tier=tier, engine=engine)

    def engine_q(self, prefix: str = "") -> Q:
        """The cells the engine filter keeps (everything without one)."""
        parsed = parse_engine_filter(self.engine)
        if parsed is None:
            return Q()
        name, version = parsed
        return Q(**{f"{prefix}engine__name": name, **({f"{prefix}engine__version": version} if version else {})})


@dataclass
class CellView:
    """What a matrix cell shows."""

    tier: int
    failed_stage: str
    fits: bool | None
    fits_devices: int | None
    lead_hours: float | None
    job_count: int
    reached_at: datetime | None = None  # when the current tier was first reached
    fits_dtype: str | None = None  # the format the fits estimate assumed (the checkpoint's own by default)
    tier_reached: dict[str, str] = field(default_factory=dict)  # "tier" -> ISO time it was first reached
    custom_thresholds: bool = False  # the tier rests on thresholds looser than the defaults
    synthetic: bool = False  # the tier rests on seeded evidence
    disputed: list[str] = field(default_factory=list)  # stages whose agent claim the portal's verdict refutes
    engine: str = DEFAULT_ENGINE  # the engine whose cell this is (the best one of the model × hardware)
    default_engine: bool = True
    engines: list[tuple[str, int]] = field(default_factory=list)  # every engine's (ref, tier), best first
    rank: tuple[Any, ...] = field(default=(), repr=False, compare=False)  # keep_best's order
    quant_mode: str | None = None  # a quantised format here: "native" or "emulated" (the fit estimate's quant.mode)
    quant_reason: str | None = None  # why it runs emulated (the hardware lacks the type, or the runtime a kernel)

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]

    def as_dict(self) -> dict[str, Any]:
        return {"tier": self.tier, "tier_name": self.tier_name, "failed_stage": self.failed_stage or None,
                "fits": self.fits, "fits_devices": self.fits_devices, "fits_dtype": self.fits_dtype,
                "lead_time_hours": self.lead_hours, "tier_reached_at": self.tier_reached,
                "reached_at": self.reached_at.isoformat() if self.reached_at else None, "jobs": self.job_count,
                "custom_thresholds": self.custom_thresholds, "synthetic": self.synthetic,
                "disputed": list(self.disputed), "engine": self.engine,
                "engines": [{"engine": ref, "tier": tier} for ref, tier in self.engines or [(self.engine, self.tier)]]}


@dataclass
class Matrix:
    models: list[ModelRelease]
    hardware: list[Hardware]
    cells: dict[tuple[int, int], CellView] = field(default_factory=dict)

    def row(self, model: ModelRelease) -> list[CellView | None]:
        return [self.cells.get((model.pk, hw.pk)) for hw in self.hardware]


def lead_hours(reached_at: datetime | None, released_at: datetime | None) -> float | None:
    """The Day-0 lead time: hours from the model's release to the time the tier was reached."""
    if reached_at is None or released_at is None:
        return None
    return round((reached_at - released_at).total_seconds() / 3600, 1)


def _hardware(filters: MatrixFilters) -> list[Hardware]:
    hardware_qs = Hardware.objects.all()
    if filters.vendor:
        hardware_qs = hardware_qs.filter(vendor__iexact=filters.vendor)
    return list(hardware_qs.only("id", "slug", "vendor", "name", "memory_bytes", "devices_per_node"))


def _models_q(actor: Actor, filters: MatrixFilters) -> Q:
    models_q = visible_models_q(actor)
    if filters.family:
        models_q &= Q(family=filters.family)
    return models_q


def _models(actor: Actor, filters: MatrixFilters) -> list[ModelRelease]:
    return list(
        ModelRelease.objects.filter(_models_q(actor, filters)).select_related("organization").only(
            "id", "slug", "name", "architecture", "family", "params_total", "params_active", "context_length",
            "released_at", "visibility", "organization__slug", "organization__name",
        )
    )


def _cells(actor: Actor, models: list[ModelRelease], hardware: list[Hardware],
           filters: MatrixFilters) -> dict[tuple[int, int], CellView]:
    known = {m.pk for m in models}
    cells_q = Q(model_id__in=list(known)) if len(known) < 1000 else Q(visible_models_q(actor, prefix="model__"))
    if filters.vendor:
        cells_q &= Q(hardware_id__in=[h.pk for h in hardware])
    cells_q &= filters.engine_q()
    cells: dict[tuple[int, int], CellView] = {}
    if not known:
        return cells
    for (model_id, hw_id, tier, failed, fits, devices, lead, jobs, reached, dtype, reached_map, custom, synthetic,
         disputed, name, version, default, quant_mode, quant_reason) in Cell.objects.filter(cells_q).values_list(*CELL_COLUMNS):
        if model_id in known:
            view = CellView(tier, failed, fits, devices, lead, jobs, reached, dtype,
                            reached_map if isinstance(reached_map, dict) else {}, bool(custom), bool(synthetic),
                            list(disputed or []), f"{name}@{version}" if version else name, bool(default),
                            quant_mode=quant_mode if quant_mode in ("native", "emulated") else None,
                            quant_reason=quant_reason if isinstance(quant_reason, str) else None)
            keep_best(cells, (model_id, hw_id), view, version)
    return cells


def engine_rank(tier: int, default: bool, jobs: int, version: str) -> tuple[Any, ...]:
    """The best engine's cell of a model × hardware ranks highest: the highest tier; on a tie the default engine,
    then the one tested, then the newest version."""
    return (tier, bool(default), jobs > 0, version_key(version))


def keep_best(cells: dict[tuple[int, int], CellView], key: tuple[int, int], view: CellView, version: str) -> None:
    """Adds ``view`` to the engines of ``key`` and keeps the best one as the cell shown; its ``engines`` list
    every engine's (ref, tier), the shown one first, then by tier."""
    view.rank = engine_rank(view.tier, view.default_engine, view.job_count, version)
    shown = cells.get(key)
    if shown is None:
        view.engines = [(view.engine, view.tier)]
        cells[key] = view
        return
    engines = [*shown.engines, (view.engine, view.tier)]
    if view.rank > shown.rank:
        cells[key] = shown = view
    shown.engines = sorted(engines, key=lambda e: (e[0] != shown.engine, -e[1]))


def build_matrix(actor: Actor, filters: MatrixFilters | None = None) -> Matrix:
    """The models ``actor`` may see (newest release first) × hardware, with their cells."""
    filters = filters or MatrixFilters()
    hardware = _hardware(filters)
    models = _models(actor, filters)
    cells = _cells(actor, models, hardware, filters)
    if filters.min_tier:
        keep = {mid for (mid, _), cell in cells.items() if cell.tier >= filters.min_tier}
        models = [m for m in models if m.pk in keep]
    return Matrix(models=models, hardware=hardware, cells=cells)


@dataclass
class MatrixPage:
    """One page of the matrix's rows: ``matrix`` holds only this page's models and their cells; ``total`` the
    rows the filters keep, ``shown`` those ``keep`` keeps too (what the pages split)."""

    matrix: Matrix
    number: int
    size: int
    total: int
    shown: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.shown // self.size))

    @property
    def first_row(self) -> int:
        return (self.number - 1) * self.size + 1 if self.shown else 0

    @property
    def last_row(self) -> int:
        return min(self.shown, self.number * self.size)


def _reaching(filters: MatrixFilters, model_ids: list[int], hardware: list[Hardware]) -> set[int]:
    """The models of ``model_ids`` reaching ``filters.min_tier`` on some hardware (of the engine filter's cells)."""
    reaching = Cell.objects.filter(filters.engine_q(), model_id__in=model_ids, tier__gte=filters.min_tier)
    if filters.vendor:
        reaching = reaching.filter(hardware_id__in=[h.pk for h in hardware])
    return set(reaching.values_list("model_id", flat=True).distinct())


def select_rows(actor: Actor, filters: MatrixFilters) -> tuple[list[Hardware], list[ModelRelease]]:
    """The hardware columns and the model rows of ``build_matrix`` without their cells: two queries, three with
    ``min_tier`` (the models reaching it)."""
    hardware = _hardware(filters)
    models = _models(actor, filters)
    if filters.min_tier and models:
        ids = _reaching(filters, [m.pk for m in models], hardware)
        models = [m for m in models if m.pk in ids]
    return hardware, models


def select_row_values(actor: Actor, filters: MatrixFilters, *fields: str) -> tuple[list[Hardware], list[tuple]]:
    """``select_rows`` with each model as a tuple (its id, then ``fields``, ``values_list`` names): the same rows
    in the same order, without building model objects (half the time at 200 rows)."""
    hardware = _hardware(filters)
    models = list(ModelRelease.objects.filter(_models_q(actor, filters)).values_list("id", *fields))
    if filters.min_tier and models:
        ids = _reaching(filters, [m[0] for m in models], hardware)
        models = [m for m in models if m[0] in ids]
    return hardware, models


Row = TypeVar("Row")


def page_of(models: list[Row], number: int, size: int) -> tuple[int, list[Row]]:
    """Page ``number`` (from 1; past the last, the last) of ``size`` rows: its number and its rows."""
    number = min(max(1, number), max(1, -(-len(models) // size)))
    return number, models[(number - 1) * size:number * size]


def build_matrix_page(actor: Actor, filters: MatrixFilters, number: int, size: int,
                      keep: Callable[[ModelRelease], bool] | None = None) -> MatrixPage:
    """Page ``number`` of ``size`` rows of ``build_matrix``, the rows first narrowed by ``keep``: the cells of that
    page's models only. Four queries at most whatever the rows (``select_rows``, the page's cells)."""
    hardware, models = select_rows(actor, filters)
    total = len(models)
    if keep is not None:
        models = [m for m in models if keep(m)]
    number, rows = page_of(models, number, size)
    matrix = Matrix(models=rows, hardware=hardware, cells=_cells(actor, rows, hardware, filters))
    return MatrixPage(matrix=matrix, number=number, size=size, total=total, shown=len(models))


def family_choices() -> list[str]:
    return list(ModelRelease.objects.order_by("family").values_list("family", flat=True).distinct())


def vendor_choices() -> list[str]:
    return list(Hardware.objects.order_by("vendor").values_list("vendor", flat=True).distinct())


def engine_choices() -> list[str]:
    """The engine filter's choices: each engine name that has cells (every version), then each NAME@VERSION."""
    rows = set(Cell.objects.values_list("engine__name", "engine__version").distinct())
    names = sorted({name for name, _ in rows})
    refs = sorted((f"{n}@{v}" for n, v in rows if v), key=lambda r: (r.split("@")[0], version_key(r.split("@")[1])))
    return names + refs
