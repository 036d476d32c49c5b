"""The verdict rules migration 0004 judged stored results with (the verdicts as they were when it was
written), frozen: the contract's ``verdicts`` move on, what 0004 did does not. Django's migration loader skips
this package (its name starts with ``_``). ``base``: the facts, the verdict and the claim; ``rules``: the
per-stage rules and ``judge``. The plan rule recomputes with the contract's planner (arithmetic over the
config, not a threshold), the one part not frozen."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.evidence.migrations._frozen_0004 import thresholds as th

PASS, FAIL, INCOMPLETE = "pass", "fail", "incomplete"
LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
PERCENTILES: tuple[str, ...] = ("p50", "p90", "p99")
# the agent's own pass flag of each stage, kept as a claim
CLAIM_KEYS: dict[str, str] = {"plan": "fits", "load": "ok", "align": "passed", "serve": "text_path_ok",
                              "eval": "passed"}
LOWER_IS_BETTER = ("perplexity", "ppl", "loss", "error", "wer", "cer")


@dataclass(frozen=True)
class ModelFacts:
    """What the judge knows about the model apart from the evidence. None: not known."""

    config: Mapping[str, Any] | None = None
    has_chat_template: bool | None = None
    takes_images: bool = False
    declared_tensors: int | None = None
    manifest: Sequence[Mapping[str, Any]] | None = None  # [{"name", "size", "sha256"}]
    manifest_source: str = ""  # "given" | "first seen"
    context_length: int | None = None
    runtime_path: str | None = None  # "native" | "fallback"


@dataclass(frozen=True)
class HardwareFacts:
    memory_bytes: int
    devices_per_node: int
    shared_memory: bool = False
    dtypes: Sequence[str] = ()


@dataclass(frozen=True)
class Context:
    """Facts a verdict may need: the model, the hardware (for plan), the job's dtype."""

    model: ModelFacts = field(default_factory=ModelFacts)
    hardware: HardwareFacts | None = None
    dtype: str | None = None
    planner: Callable[..., Mapping[str, Any]] | None = None  # default: contract.planner.plan_report


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


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def claimed(stage: str, section: Mapping[str, Any] | None) -> bool | None:
    """The agent's own pass flag for a stage (None when it set none). Bench has no flag: none is claimed."""
    if not isinstance(section, Mapping) or stage not in CLAIM_KEYS:
        return None
    value = section.get(CLAIM_KEYS[stage])
    return value if isinstance(value, bool) else None


def manifest_mismatches(shards: Sequence[Mapping[str, Any]], manifest: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every disagreement between loaded shards ``[{file, sha256, bytes?}]`` and a manifest
    ``[{name, size, sha256}]``, one sentence each naming the shard and both digests."""
    want = {str(m.get("name")): m for m in manifest}
    got = {str(s.get("file")): s for s in shards}
    out = []
    for name, shard in got.items():
        entry = want.get(name)
        if entry is None:
            out.append(f"shard {name} is not in the release's manifest")
            continue
        digest = str(shard.get("sha256") or "").lower()
        expected = str(entry.get("sha256") or "").lower()
        if digest != expected:
            out.append(f"shard {name} sha256 {digest or 'missing'} differs from the manifest's {expected}")
        size = shard.get("size", shard.get("bytes"))
        if isinstance(size, int) and isinstance(entry.get("size"), int) and size != entry["size"]:
            out.append(f"shard {name} is {size} bytes, the manifest says {entry['size']}")
    out += [f"shard {name} of the manifest was not loaded" for name in want if name not in got]
    return out


def _token_ids(top: Any) -> set[Any]:
    """Token ids of a top-k list: [{"token", ...}] or [[token, logprob], ...]."""
    out = set()
    for item in top if isinstance(top, list) else []:
        if isinstance(item, Mapping):
            out.add(item.get("token"))
        elif isinstance(item, list | tuple) and item:
            out.add(item[0])
    return out
