"""The tier rule of DESIGN.md §3, shared by the pipeline (the tier a report claims) and the portal (the tier
a cell shows from the newest evidence of each stage). Pure functions, no Django, no torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TIER_NAMES: dict[int, str] = {
    0: "untested",
    1: "planned",
    2: "loads",
    3: "serves",
    4: "aligned",
    5: "baselined",
    6: "validated",
}

# tier -> the stage whose passing evidence (on top of every lower tier's) reaches it
TIER_GATES: tuple[tuple[int, str], ...] = (
    (1, "plan"),
    (2, "load"),
    (3, "serve"),
    (4, "align"),
    (5, "bench"),
    (6, "eval"),
)

STAGE_ORDER: tuple[str, ...] = ("plan", "load", "inventory", "align", "serve", "bench", "eval", "env")
DEFAULT_STAGES: tuple[str, ...] = ("plan", "load", "inventory", "align", "serve", "bench", "env")


def stage_passed(stage: str, section: Mapping[str, Any] | None) -> bool | None:
    """Whether a stage's report section is passing evidence. None: no evidence (section absent).

    Stages that gate no tier (inventory, env) pass when they produced a section."""
    if section is None:
        return None
    if stage == "plan":
        return bool(section.get("fits"))
    if stage == "load":
        return bool(section.get("ok"))
    if stage == "serve":
        return bool(section.get("text_path_ok"))
    if stage == "align":
        kv = section.get("kv_cache")
        return bool(section.get("passed")) and (kv is None or bool(kv.get("passed")))
    if stage == "bench":
        runs = section.get("runs") or []
        return any((run.get("output_tok_s") or 0) > 0 for run in runs)
    if stage == "eval":
        return bool(section.get("passed"))
    return True


def compute_tier(passed: Mapping[str, bool | None]) -> int:
    """The highest tier whose gate and every lower gate passed. ``passed`` maps stage -> pass flag."""
    tier = 0
    for level, stage in TIER_GATES:
        if passed.get(stage) is not True:
            break
        tier = level
    return tier


def tier_of_report(stages: Mapping[str, Mapping[str, Any]]) -> int:
    """The tier a stage report's ``stages`` mapping claims."""
    return compute_tier({name: stage_passed(name, section) for name, section in stages.items()})
