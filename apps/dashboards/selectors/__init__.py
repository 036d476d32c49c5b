"""Read side of the dashboard pages, one module per page; shared helpers re-exported here.

Each page costs a fixed number of queries whatever the number of jobs, runs or events."""

from __future__ import annotations

from apps.core.formatting import hours_text, human_bytes, human_count
from apps.dashboards.selectors.cell import (
    OPERATOR_STATUSES,
    CellPage,
    LadderStep,
    cell_page,
    tier_ladder,
    visible_model,
)
from apps.dashboards.selectors.day0 import TIMELINE_TIERS, Day0Release, Day0Row, Day0Timeline, LeaderRow, day0_timeline
from apps.dashboards.selectors.job import CONSOLE_LINES, JobPage, StageStatus, job_page

__all__ = [
    "CONSOLE_LINES", "TIMELINE_TIERS", "OPERATOR_STATUSES", "CellPage", "Day0Release", "Day0Row", "Day0Timeline",
    "JobPage", "LadderStep", "LeaderRow", "StageStatus", "cell_page", "day0_timeline", "hours_text", "human_bytes",
    "human_count", "job_page", "tier_ladder", "visible_model",
]
