"""The Day-0 timeline: hours from each release to each tier per hardware, and the hardware leaderboard. A cell
whose tier rests on custom thresholds or synthetic evidence, or whose claim the portal refuted (disputed), is
shown marked and left out of the leaderboard's ranking (listed apart, with why)."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from apps.accounts.access import Actor
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import visible_models_q
from apps.core.formatting import hours_text, reached_times
from apps.matrix.models import Cell
from apps.matrix.selectors import lead_hours
from contract.tiers import TIER_NAMES

TIMELINE_TIERS = (2, 3, 4, 5, 6)  # loads, serves, aligned, baselined, validated


@dataclass
class Day0Row:
    hardware: Hardware
    hours: list[float | None]  # one per TIMELINE_TIERS
    tier: int
    failed_stage: str
    marks: tuple[str, ...] = ()  # "custom thresholds", "synthetic", "disputed": not ranked

    @property
    def cells(self) -> list[tuple[float | None, str, str]]:
        return [(h, hours_text(h), f"→ {TIER_NAMES[t]}") for h, t in zip(self.hours, TIMELINE_TIERS, strict=True)]

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]


@dataclass
class Day0Release:
    model: ModelRelease
    rows: list[Day0Row]
    untested: int

    @property
    def axis(self) -> dict[str, Any]:
        """The time axis of the release's rows: the span in hours (from the earliest mark, which may be before
        the release, to the latest), ticks, and each tier's position as a percentage of the span."""
        values = [h for r in self.rows for h in r.hours if h is not None]
        low, high = min([0.0, *values]), max([1.0, *values])
        span = high - low
        step = next((s for s in (1, 2, 4, 6, 12, 24, 48, 72, 168, 336, 720, 2160) if span / s <= 8), 8760)
        first = int(low // step) * step
        ticks = [{"hours": t, "left": round(100 * (t - low) / span, 2), "label": hours_text(t).split(" (")[0]}
                 for t in range(first, int(high) + step, step) if low <= t <= high]
        marks = [[None if h is None else {"tier": t, "name": TIER_NAMES[t], "hours": h, "text": hours_text(h),
                                          "left": round(100 * (h - low) / span, 2)}
                  for h, t in zip(r.hours, TIMELINE_TIERS, strict=True)] for r in self.rows]
        return {"ticks": ticks, "release_left": round(100 * (0 - low) / span, 2),
                "rows": [{"row": r, "marks": [m for m in ms if m]} for r, ms in zip(self.rows, marks, strict=True)]}


@dataclass
class LeaderRow:
    hardware: Hardware
    medians: list[float | None]  # one per TIMELINE_TIERS
    reached: list[int]
    rank_hours: float | None

    @property
    def cells(self) -> list[tuple[float | None, str, int, str]]:
        return [(h, hours_text(h), n, f"median → {TIER_NAMES[t]}")
                for h, n, t in zip(self.medians, self.reached, TIMELINE_TIERS, strict=True)]


@dataclass
class Day0Timeline:
    releases: list[Day0Release]
    leaderboard: list[LeaderRow]
    rank_tier: int
    tiers: list[tuple[int, str]]
    hidden_hosts: list[Hardware]  # non-accelerator hosts left out of the leaderboard
    unranked: list[tuple[ModelRelease, Hardware, tuple[str, ...]]] = ()  # marked cells, left out of the medians


def cell_marks(custom_thresholds: bool, synthetic: bool, disputed: Any) -> tuple[str, ...]:
    """Why a cell's tier is not ranked beside the others: it rests on looser thresholds than the defaults, on
    seeded (synthetic) evidence, or the agent's claim of one of its stages was refuted by the portal."""
    return tuple(mark for mark, on in (("custom thresholds", custom_thresholds), ("synthetic", synthetic),
                                       ("disputed", bool(disputed))) if on)


def release_timeline(model: ModelRelease, hardware: list[Hardware],
                     cells: dict[tuple[int, int], tuple[Any, ...]]) -> Day0Release:
    """One release: per tested hardware, hours from the release to each tier (untested hardware counted).
    ``cells``: (model id, hardware id) -> (tier, failed stage, reached times[, marks])."""
    rows, untested = [], 0
    for h in hardware:
        tier, failed, reached, *rest = cells.get((model.pk, h.pk), (0, "", {}))
        marks = tuple(rest[0]) if rest else ()
        times = reached_times(reached)
        hours = [lead_hours(times.get(t), model.released_at) if t <= tier else None for t in TIMELINE_TIERS]
        if tier < TIMELINE_TIERS[0] and not failed:
            untested += 1
            continue
        rows.append(Day0Row(h, hours, tier, failed, marks))
    rows.sort(key=lambda r: (-r.tier, r.hours[0] if r.hours[0] is not None else float("inf")))
    return Day0Release(model, rows, untested)


def day0_timeline(actor: Actor, *, rank_tier: int = 3, include_hosts: bool = False) -> Day0Timeline:
    """For each visible release (newest first), hours from release to each tier on each hardware; and the
    hardware ranked by median lead time to ``rank_tier``, leaving out hosts that are not accelerators (the CPU
    demo host: its devices share one memory) unless ``include_hosts`` (three queries)."""
    if rank_tier not in TIMELINE_TIERS:
        raise ValueError(f"tier must be one of {', '.join(map(str, TIMELINE_TIERS))}, got {rank_tier}")
    models = list(ModelRelease.objects.filter(visible_models_q(actor), released_at__isnull=False)
                  .only("id", "slug", "name", "released_at", "visibility", "family"))
    hardware = list(Hardware.objects.only("id", "slug", "name", "vendor", "shared_memory"))
    cells = {(m, h): (tier, failed, reached, cell_marks(custom, synthetic, disputed))
             for m, h, tier, failed, reached, custom, synthetic, disputed in
             Cell.objects.filter(model_id__in=[m.pk for m in models], engine__default=True)  # the bundled runtime's
             .values_list("model_id", "hardware_id", "tier", "failed_stage", "tier_reached_at", "custom_thresholds",
                          "synthetic", "disputed")}
    per_hw: dict[int, list[list[float]]] = {h.pk: [[] for _ in TIMELINE_TIERS] for h in hardware}
    releases = [release_timeline(m, hardware, cells) for m in models]
    unranked = []
    for release in releases:
        for row in release.rows:
            if row.marks:  # shown on the release, left out of the ranking
                unranked.append((release.model, row.hardware, row.marks))
                continue
            for i, value in enumerate(row.hours):
                if value is not None:
                    per_hw[row.hardware.pk][i].append(value)
    board = []
    rank_index = TIMELINE_TIERS.index(rank_tier)
    hidden = [h for h in hardware if h.shared_memory and not include_hosts]
    for h in hardware:
        if h in hidden:
            continue
        lists = per_hw[h.pk]
        medians = [median(v) if v else None for v in lists]
        board.append(LeaderRow(h, medians, [len(v) for v in lists], medians[rank_index]))
    board.sort(key=lambda r: (r.rank_hours is None, r.rank_hours if r.rank_hours is not None else 0,
                              r.hardware.slug))
    return Day0Timeline(releases, board, rank_tier, [(t, TIER_NAMES[t]) for t in TIMELINE_TIERS], hidden, unranked)
