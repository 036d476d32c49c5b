"""The engines this agent can start, as its capabilities advertise them (``capabilities["engines"]``: name ->
executable path): each known engine whose executable is on PATH (``vllm`` for vLLM), plus those named in its
configuration (``--engine NAME=PATH``, or ``DAY0_AGENT_ENGINES="NAME=PATH,…"``). The portal dispatches a job
naming an engine only to a hardware whose online agents have it (``apps.jobs.placement``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

KNOWN_EXECUTABLES = {"vllm": "vllm"}  # engine name -> the program found on PATH


def parse_engine_args(values: Iterable[str]) -> dict[str, str]:
    """``NAME=PATH`` items as {name: path}; ``ValueError`` naming a malformed one."""
    engines: dict[str, str] = {}
    for item in values:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--engine takes NAME=PATH, got {item!r}")
        engines[name.strip()] = path.strip()
    return engines


def discover_engines(configured: Iterable[str] = ()) -> dict[str, str]:
    """Every engine this host can start: the known executables found on PATH, then the configured ones (which
    win). The bundled runtime is always there and is not listed."""
    found = {name: path for name, exe in KNOWN_EXECUTABLES.items() if (path := shutil.which(exe))}
    env = [v for v in os.environ.get("DAY0_AGENT_ENGINES", "").split(",") if v.strip()]
    found.update(parse_engine_args([*env, *configured]))
    return found
