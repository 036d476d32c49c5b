"""The tier rule as migration 0004 applied it (frozen: the contract's ``tiers`` and the matrix's ``tier_times``
may change, what 0004 did may not). Django's migration loader skips modules whose name starts with ``_``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

# tier -> the stage whose passing evidence (on top of every lower tier's) reaches it
TIER_GATES: tuple[tuple[int, str], ...] = (
    (1, "plan"),
    (2, "load"),
    (3, "serve"),
    (4, "align"),
    (5, "bench"),
    (6, "eval"),
)


def compute_tier(passed: Mapping[str, bool | None]) -> int:
    """The highest tier whose gate and every lower gate passed. ``passed`` maps stage -> pass flag."""
    tier = 0
    for level, stage in TIER_GATES:
        if passed.get(stage) is not True:
            break
        tier = level
    return tier


def tier_times(reached: dict[str, str], tier: int, times: dict[str, datetime], now: datetime) -> dict[str, str]:
    """The first time each tier up to ``tier`` was reached, kept monotone: a tier is reached no earlier than
    its own gate's evidence, nor than any tier below it (whatever order the stages arrived in)."""
    out = dict(reached)
    floor: datetime | None = None
    for level, stage in TIER_GATES:
        known = out.get(str(level))
        if known is None:
            if level > tier:
                break
            at = times.get(stage) or now
        else:
            at = datetime.fromisoformat(known)
        if floor is not None and at < floor:
            at = floor
        out[str(level)] = at.isoformat()
        floor = at
    return out
