"""Shared fixtures of the pipeline tests: stage contexts on the cached tiny test models."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.pipeline.support.context import StageContext
from agents.runtime.testing.make_model import cached_model


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny matmuls on this shared 2-core host run ~40× slower with 2 contending OpenMP threads than with one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class EventLog:
    """Collects the events a run emits (a real emit function, not a mock)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, kind: str, message: str, *, level: str = "info", data: dict | None = None,
                 stage: str = "") -> None:
        self.events.append({"kind": kind, "message": message, "level": level, "data": data, "stage": stage})

    def kinds(self, *wanted: str) -> list[tuple[str, str]]:
        return [(e["kind"], e["stage"]) for e in self.events if e["kind"] in wanted]


@pytest.fixture
def make_ctx() -> Callable[..., tuple[StageContext, EventLog]]:
    """make_ctx(arch | path, **overrides) -> (StageContext on the cpu hardware, its event log)."""

    def build(model: str | Path = "llama", **overrides: Any) -> tuple[StageContext, EventLog]:
        from contract.hardware import get_hardware

        path = cached_model(model) if isinstance(model, str) else model
        log = EventLog()
        fields: dict[str, Any] = {
            "model_dir": path,
            "config": json.loads((path / "config.json").read_text()),
            "hardware": get_hardware("cpu").to_dict(),
            "emit_fn": log,
        }
        fields.update(overrides)
        return StageContext(**fields), log

    return build
