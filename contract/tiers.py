"""The tier rule (tiers 0–6, each gated by one stage's passing evidence on top of every lower tier's), shared by
the pipeline (the tier a report claims) and the portal (the tier a cell shows from the newest verdict of each
stage). Pure functions, no Django, no torch; the per-stage rules live in ``contract.verdicts``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract import verdicts

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

# ``reference``: a reference job's outputs (docs/references.md); it gates no tier
# ``conformance``: after serve (it questions the server serve left up); not a default stage, except that a
# pipeline whose model's chat template declares tools runs it after serve (``with_conformance``)
STAGE_ORDER: tuple[str, ...] = ("plan", "load", "inventory", "align", "serve", "conformance", "bench", "eval", "soak",
                               "comm", "env", "reference")
DEFAULT_STAGES: tuple[str, ...] = ("plan", "load", "inventory", "align", "serve", "bench", "env")


def stage_passed(stage: str, section: Mapping[str, Any] | None, thresholds: Mapping[str, Any] | None = None,
                 context: verdicts.Context | None = None) -> bool | None:
    """Whether a stage's report section is passing evidence by ``contract.verdicts`` (None: no section).
    An incomplete section is not passing. Stages that gate no tier (inventory, env) pass with a section."""
    if section is None:
        return None
    return verdicts.judge(stage, section, thresholds, context).passed


def with_conformance(stages: list[str], template_declares_tools: bool) -> list[str]:
    """``stages`` (in STAGE_ORDER) with ``conformance`` added after ``serve`` when the model's chat template
    declares tools (tier 3 then needs it)."""
    if not template_declares_tools or "serve" not in stages or "conformance" in stages:
        return list(stages)
    return [s for s in STAGE_ORDER if s in stages or s == "conformance"]


def declares_tools(stages: Mapping[str, Any] | None, known: bool | None = None) -> bool:
    """Whether tier 3 needs conformance: the portal's fact about the model's template where it has one
    (``known``), or what the serve or conformance section found in the template."""
    if known is not None:
        return known
    return any(isinstance(s, Mapping) and s.get("template_declares_tools") is True
               for s in ((stages or {}).get("serve"), (stages or {}).get("conformance")))


def compute_tier(passed: Mapping[str, bool | None], *, template_declares_tools: bool = False) -> int:
    """The highest tier whose gate and every lower gate passed. ``passed`` maps stage -> pass flag. Where the
    model's chat template declares tools, the serve gate also needs a passing ``conformance``."""
    if template_declares_tools:
        passed = {**passed, "serve": passed.get("serve") is True and passed.get("conformance") is True}
    tier = 0
    for level, stage in TIER_GATES:
        if passed.get(stage) is not True:
            break
        tier = level
    return tier


def tier_of_report(stages: Mapping[str, Mapping[str, Any]], thresholds: Mapping[str, Any] | None = None,
                   context: verdicts.Context | None = None) -> int:
    """The tier the verdicts on a stage report's ``stages`` mapping reach."""
    known = (context or verdicts.Context()).model.template_declares_tools
    return compute_tier({name: stage_passed(name, section, thresholds, context) for name, section in stages.items()},
                        template_declares_tools=declares_tools(stages, known))
