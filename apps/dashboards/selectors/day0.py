"""The Day-0 timeline: hours from each release to each tier per hardware, and the hardware leaderboard."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from django.utils.dateparse import parse_datetime

from agents.pipeline.tiers import TIER_NAMES
from apps.accounts.access import Actor
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import visible_models_q
from apps.dashboards.selectors.format import hours_text
from apps.matrix.models import Cell
from apps.matrix.selectors import lead_hours

DAY0_TIERS = (2, 3, 4, 5, 6)  # loads, serves, aligned, baselined, validated


@dataclass
class Day0Row:
    hardware: Hardware
    hours: list[float | None]  # one per DAY0_TIERS
    tier: int
    failed_stage: str

    @property
    def cells(self) -> list[tuple[float | None, str, str]]:
        return [(h, hours_text(h), f"→ {TIER_NAMES[t]}") for h, t in zip(self.hours, DAY0_TIERS, strict=True)]

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]


@dataclass
class Day0Release:
    model: ModelRelease
    rows: list[Day0Row]
    untested: int


@dataclass
class LeaderRow:
    hardware: Hardware
    medians: list[float | None]  # one per DAY0_TIERS
    reached: list[int]
    rank_hours: float | None

    @property
    def cells(self) -> list[tuple[float | None, str, int, str]]:
        return [(h, hours_text(h), n, f"median → {TIER_NAMES[t]}")
                for h, n, t in zip(self.medians, self.reached, DAY0_TIERS, strict=True)]


@dataclass
class Day0Timeline:
    releases: list[Day0Release]
    leaderboard: list[LeaderRow]
    rank_tier: int
    tiers: list[tuple[int, str]]


def day0_timeline(actor: Actor, *, rank_tier: int = 3) -> Day0Timeline:
    """For each visible release (newest first), hours from release to each tier on each hardware; and the
    hardware ranked by median lead time to ``rank_tier`` (three queries)."""
    if rank_tier not in DAY0_TIERS:
        raise ValueError(f"tier must be one of {', '.join(map(str, DAY0_TIERS))}, got {rank_tier}")
    models = list(ModelRelease.objects.filter(visible_models_q(actor), released_at__isnull=False)
                  .only("id", "slug", "name", "released_at", "visibility", "family"))
    hardware = list(Hardware.objects.only("id", "slug", "name", "vendor"))
    cells = {(m, h): (tier, failed, reached) for m, h, tier, failed, reached in
             Cell.objects.filter(model_id__in=[m.pk for m in models])
             .values_list("model_id", "hardware_id", "tier", "failed_stage", "tier_reached_at")}
    per_hw: dict[int, list[list[float]]] = {h.pk: [[] for _ in DAY0_TIERS] for h in hardware}
    releases = []
    for m in models:
        rows, untested = [], 0
        for h in hardware:
            tier, failed, reached = cells.get((m.pk, h.pk), (0, "", {}))
            times = {int(k): parse_datetime(v) for k, v in (reached or {}).items() if str(k).isdigit()}
            hours = [lead_hours(times.get(t), m.released_at) if t <= tier else None for t in DAY0_TIERS]
            if tier < DAY0_TIERS[0] and not failed:
                untested += 1
                continue
            rows.append(Day0Row(h, hours, tier, failed))
            for i, value in enumerate(hours):
                if value is not None:
                    per_hw[h.pk][i].append(value)
        rows.sort(key=lambda r: (-r.tier, r.hours[0] if r.hours[0] is not None else float("inf")))
        releases.append(Day0Release(m, rows, untested))
    board = []
    rank_index = DAY0_TIERS.index(rank_tier)
    for h in hardware:
        lists = per_hw[h.pk]
        medians = [median(v) if v else None for v in lists]
        board.append(LeaderRow(h, medians, [len(v) for v in lists], medians[rank_index]))
    board.sort(key=lambda r: (r.rank_hours is None, r.rank_hours if r.rank_hours is not None else 0,
                              r.hardware.slug))
    return Day0Timeline(releases, board, rank_tier, [(t, TIER_NAMES[t]) for t in DAY0_TIERS])
