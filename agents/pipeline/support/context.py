"""The stage interface: every stage is a ``run(ctx: StageContext) -> dict`` returning its report section
(the keys of docs/stage-report.md), registered in ``agents.pipeline.registry``. A stage that cannot continue raises
``StageFailed`` with a message naming what was wrong; a stage whose section says "not passing" (align.passed
false, load.ok false …) also stops the pipeline — the runner decides that with ``contract.verdicts``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.pipeline.support.errors import JobCancelled
from agents.pipeline.support.state import JobState

# emit(kind, message, *, level="info", data=None): kinds are "stage_started", "stage_finished", "progress",
# "log", "result". The agent turns these into ordered events posted to the portal; standalone `day0 adapt`
# prints them.
Emit = Callable[..., None]


def _print_emit(kind: str, message: str, *, level: str = "info", data: dict | None = None, stage: str = "") -> None:
    if kind != "progress":
        print(f"[{stage or '-':>9}] {level:<7} {message}", flush=True)


@dataclass
class StageContext:
    """Everything a stage needs. ``results`` holds the sections of the stages already run in this job, ``state``
    the objects they handed on (a loaded model, a server)."""

    model_dir: Path | None  # None: config-only (meta device) for plan/inventory of huge models
    config: dict[str, Any]  # the model's config.json
    hardware: dict[str, Any]  # hardware spec: slug, memory_gb, devices_per_node, dtypes, operator_manifest …
    dtype: str = "float32"
    device: str = "cpu"  # torch device string of the target
    quant_mode: str = "auto"  # FP8 per tensor/channel: auto, native (W8A8) or emulated (``layers/fp8_native.py``)
    tp: int | None = None  # plan override; None: the planner's choice clipped to local devices
    ep: int | None = None
    pp: int | None = None  # pipeline stages (``day0 adapt --pp``); the ranks are pp × max(tp, ep)
    # ranks across hosts (``agents.runtime.nodes.NodeSpec``, ``day0 adapt --nnodes …``): each stage with ranks
    # runs this node's share of them (``agents.pipeline.support.nodes``); None: every rank on this host
    node: Any = None
    thresholds: dict[str, float] = field(default_factory=dict)  # overrides of contract.thresholds defaults
    bench: dict[str, Any] = field(default_factory=dict)  # concurrency, input_len, output_len, num_prompts …
    # the release's checksum manifest of its weight files, ``[{"name", "size", "sha256"}]`` (``day0 adapt
    # --manifest FILE``; a portal job never carries it: the portal compares); the load fails on any disagreement
    manifest: list[dict[str, Any]] | None = None
    # a quantised release's unquantised original (``day0 adapt --original DIR``); None: ``model_dir/original``
    # when it exists (make-model's layout). Align measures the quantisation's cost against it (docs/quantized.md)
    original_dir: Path | None = None
    # the portal's weight challenge of this attempt (``support/weight_probe.py``): a reference run's
    # ``{"count", "length", "positions"}`` to sample each shard at, or a certify job's ``{"nonce", "probes"}``
    weight_samples: dict[str, Any] | None = None
    weight_probe: dict[str, Any] | None = None
    # what the portal's job hands the stages beyond the model (docs/references.md): ``purpose`` "certify" or
    # "reference"; ``nonce`` this attempt's secret; ``challenge`` the items a certify job answers with the target
    # (``{"nonce", "top_k", "e2e", "mc", "qa", "ppl", "needle"}``); ``reference_pool`` the items a reference
    # run answers with ``transformers`` fp32 (the ``reference`` stage). None: not part of this job.
    purpose: str = "certify"
    nonce: str | None = None
    challenge: dict[str, Any] | None = None
    reference_pool: dict[str, Any] | None = None
    # the serving engine (``contract.engines``: {name, version, command, executable, capabilities}); None: the
    # bundled runtime. An external one is started by its command and queried through its endpoint only
    engine: dict[str, Any] | None = None
    workdir: Path = field(default_factory=lambda: Path("var/adapt"))
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    emit_fn: Emit = _print_emit
    cancel_event: threading.Event = field(default_factory=threading.Event)
    current_stage: str = ""
    state: JobState = field(default_factory=JobState)

    def emit(self, kind: str, message: str, *, level: str = "info", data: dict | None = None) -> None:
        self.emit_fn(kind, message, level=level, data=data, stage=self.current_stage)

    def progress(self, done: int, total: int, what: str) -> None:
        self.emit("progress", f"{what}: {done}/{total}", data={"done": done, "total": total, "what": what})

    def check_cancelled(self) -> None:
        if self.cancel_event.is_set():
            raise JobCancelled("job cancelled")
