"""The version lock: what a run's numbers depend on besides the model and the hardware — the engine's exact
command line and version, the environment it ran under (threads, allocator), package versions and host facts.
The agent records it (the serve section's ``engine`` block, the ``env`` section); the portal flattens two runs'
locks and says exactly which entries differ (``lock_diff``), so a comparison is fair by construction or says why
it is not. Stdlib only: the pipeline and the portal share it."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

# environment variables that change an engine's speed or numbers: threads, thread binding, allocators, caches
LOCKED_ENV_VARS: tuple[str, ...] = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS", "OMP_PROC_BIND",
    "OMP_PLACES", "KMP_AFFINITY", "GOMP_CPU_AFFINITY", "LD_PRELOAD", "MALLOC_ARENA_MAX", "MALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "TCMALLOC_RELEASE_RATE", "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ATTENTION_BACKEND",
    "VLLM_USE_V1", "TOKENIZERS_PARALLELISM",
)
# host facts and package versions of the env section, as they are named there
HOST_KEYS: tuple[str, ...] = ("device", "device_count", "driver", "cpu_model", "cpu_count", "platform",
                              "dispatch_key", "target", "threads")
PACKAGE_KEYS: tuple[str, ...] = ("runtime_commit", "torch", "python", "python_implementation", "transformers",
                                 "safetensors", "tokenizers", "numpy")
VALUE_MAX = 500


def locked_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The locked variables that are set in ``environ`` (an unset one is absent, as it was to the process)."""
    return {name: str(environ[name])[:VALUE_MAX] for name in LOCKED_ENV_VARS if name in environ}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return shlex.join(str(v) for v in value)[:VALUE_MAX * 4]
    return str(value)[:VALUE_MAX]


def flatten_lock(serve: Any, env: Any) -> dict[str, str | None]:
    """One run's lock as ``{"group.key": text}``: ``engine.*`` (name, version, reported version, the exact argv,
    ``engine.env.VAR``), ``env.VAR`` (the pipeline's environment), ``package.*``, ``host.*``. A run of the bundled
    runtime has engine ``day0`` and no command; a section that is missing or malformed adds nothing."""
    serve = serve if isinstance(serve, dict) else {}
    env = env if isinstance(env, dict) else {}
    engine = serve.get("engine") if isinstance(serve.get("engine"), dict) else {}
    out: dict[str, str | None] = {"engine.name": _text(engine.get("name")) or "day0",
                                  "engine.version": _text(engine.get("version")),
                                  "engine.reported_version": _text(engine.get("reported_version")),
                                  "engine.command": _text(engine.get("command"))}
    engine_env = engine.get("environment") if isinstance(engine.get("environment"), dict) else {}
    for name, value in sorted(engine_env.items()):
        out[f"engine.env.{str(name)[:100]}"] = _text(value)
    run_env = env.get("environment") if isinstance(env.get("environment"), dict) else {}
    for name, value in sorted(run_env.items()):
        out[f"env.{str(name)[:100]}"] = _text(value)
    for key in PACKAGE_KEYS:
        if key in env:
            out[f"package.{key}"] = _text(env.get(key))
    for key in HOST_KEYS:
        if key in env:
            out[f"host.{key}"] = _text(env.get(key))
    return out


def lock_diff(a: Mapping[str, str | None], b: Mapping[str, str | None]) -> list[tuple[str, str | None, str | None,
                                                                                      bool]]:
    """Every entry of either lock as (key, a, b, differs), the differing ones first, each group in key order. An
    entry one run has and the other lacks differs (a variable set on one side only changes the run)."""
    rows = [(key, a.get(key), b.get(key), a.get(key) != b.get(key)) for key in sorted(set(a) | set(b))]
    return sorted(rows, key=lambda r: not r[3])
