"""The parts every stage verdict shares: the facts a judge may know (model, hardware, dtype), the ``Verdict``
itself, the agent's claim flags, and number helpers. Pure: no Django, no torch (``verdicts`` re-exports it)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract import thresholds as th

PASS, FAIL, INCOMPLETE = "pass", "fail", "incomplete"
LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
PERCENTILES: tuple[str, ...] = ("p50", "p90", "p99")
# the agent's own pass flag of each stage, kept as a claim
CLAIM_KEYS: dict[str, str] = {"plan": "fits", "load": "ok", "align": "passed", "serve": "text_path_ok",
                              "eval": "passed", "conformance": "passed"}
LOWER_IS_BETTER = ("perplexity", "ppl", "loss", "error", "wer", "cer", "bits_per", "bpb", "nll")
HIGHER_IS_BETTER = ("acc", "exact", "match", "f1", "bleu", "rouge", "pass", "score")


@dataclass(frozen=True)
class ModelFacts:
    """What the judge knows about the model apart from the evidence. None: not known."""

    config: Mapping[str, Any] | None = None
    has_chat_template: bool | None = None
    takes_images: bool = False
    declared_tensors: int | None = None
    manifest: Sequence[Mapping[str, Any]] | None = None  # [{"name", "size", "sha256"}]
    manifest_source: str = ""  # "given" | "staff" | "reference" | "first seen (legacy)" (never compared with)
    context_length: int | None = None
    runtime_path: str | None = None  # "native" | "fallback"
    # the chat template reads ``tools`` (contract.conformance.declares_tools): tier 3 then needs conformance
    template_declares_tools: bool | None = None


@dataclass(frozen=True)
class HardwareFacts:
    memory_bytes: int
    devices_per_node: int
    shared_memory: bool = False
    dtypes: Sequence[str] = ()
    memory_bandwidth_gbps: float | None = None  # per device, the spec sheet's; None: unknown (no TPOT floor)
    # an organization's own hardware (its spec is its owner's word): a bench there is held to a stated bandwidth,
    # so clearing it cannot lift the physics floor; a shared entry operated by staff may state none (a note)
    owned: bool = False


@dataclass(frozen=True)
class Context:
    """Facts a verdict may need: the model, the hardware (for plan and the bench's physics), the job's dtype,
    the layout the job ran (``{"tp", "pp", "ep"}``: pinned by the job or its plan evidence), what the job asked
    the bench to run (its ``spec.bench``) and the operators of the job's inventory section."""

    model: ModelFacts = field(default_factory=ModelFacts)
    hardware: HardwareFacts | None = None
    dtype: str | None = None
    layout: Mapping[str, int] | None = None
    bench_asked: Mapping[str, Any] | None = None
    inventory_ops: Sequence[str] | None = None
    planner: Callable[..., Mapping[str, Any]] | None = None  # default: contract.planner.plan_report
    # the portal's judge of raw outputs against its reference (challenges.verdicts.ChallengeJudge): when set, the
    # align end-to-end part and the eval verdict come from it; None (a standalone run) judges the agent's numbers
    challenge: Callable[[Verdict, str, Mapping[str, Any], Mapping[str, float]], None] | None = None
    # the load's weight probe as the portal expects it: {"nonce", "probes": [{"file", "offset", "length",
    # "sha256"}], "answers": stored answers or None} or {"probes": [], "reason"}; None: not judged by the portal
    weight_probe: Mapping[str, Any] | None = None
    # the engine the job ran (``contract.engines``: a name; None or "day0": the bundled runtime). An external
    # engine's align is endpoint align (``contract.endpoint_align``); the bundled runtime's never is
    engine: str | None = None


@dataclass
class Verdict:
    """A stage's verdict: status, the reasons (empty when passing), notes, and the defaults it judged with."""

    stage: str
    status: str = PASS
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    defaults_version: str = th.DEFAULTS_VERSION
    custom_thresholds: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def fail(self, reason: str) -> None:
        self.reasons.append(f"{self.stage}: {reason}")
        if self.status == PASS:
            self.status = FAIL

    def missing(self, reason: str) -> None:
        self.reasons.append(f"{self.stage}: {reason}")
        self.status = INCOMPLETE

    def note(self, text: str) -> None:
        self.notes.append(f"{self.stage}: {text}")

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "status": self.status, "reasons": list(self.reasons), "notes": list(self.notes),
                "defaults_version": self.defaults_version, "custom_thresholds": list(self.custom_thresholds)}


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def text(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def claimed(stage: str, section: Mapping[str, Any] | None) -> bool | None:
    """The agent's own pass flag for a stage (None when it set none). Bench has no flag: none is claimed."""
    if not isinstance(section, Mapping) or stage not in CLAIM_KEYS:
        return None
    value = section.get(CLAIM_KEYS[stage])
    return value if isinstance(value, bool) else None
