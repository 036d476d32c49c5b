"""The engine catalog: the built-in engines (``day0``, the bundled runtime and default; ``vllm@0.32.0``;
``openai-compatible``, whose command the job gives), resolving a job's ``NAME`` or ``NAME@VERSION`` against it,
and the ``engine`` object a job spec carries to the agent (``contract.engines``)."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from apps.catalog.models import Engine
from contract.engines import DEFAULT_ENGINE, GENERIC_ENGINE, check_template, parse_ref

# the built-in engines; migrations 0007 and 0009 seed the same rows (a migration keeps its own copy)
BUILTIN: tuple[dict[str, Any], ...] = (
    {"name": DEFAULT_ENGINE, "version": "", "default": True, "executable": "", "obtained_by": "bundled with the agent",
     "command": "", "capabilities": {"logprobs": True, "prompt_logprobs": True, "images": True, "tools": True,
                                     "structured_output": True},
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


def default_engine() -> Engine:
    """The engine a job that names none runs (the bundled ``day0``), created with the built-ins when missing."""
    engine = Engine.objects.filter(default=True).order_by("id").first()
    if engine is None:
        ensure_builtin_engines()
        engine = Engine.objects.filter(default=True).order_by("id").first() or Engine.objects.get(name=DEFAULT_ENGINE,
                                                                                                  version="")
    return engine


def default_engine_id() -> int:
    """``Cell.engine``'s default: a cell created without an engine is the bundled runtime's."""
    return default_engine().pk


def engine_for_spec(spec: Any) -> Engine:
    """The catalog engine whose cell a job's evidence lands in: the spec's ``engine`` {name, version} as the job
    named it at submission (the *requested* catalog version is the key; the version the engine reported is
    evidence, shown beside it). A spec naming none, or ``day0``, is the default engine; a version the catalog has
    no row of (the generic engine's submitter-given one) is the engine's versionless row; a name the catalog no
    longer has gets its row back (the evidence must land somewhere it can be seen)."""
    engine = spec.get("engine") if isinstance(spec, dict) else None
    if not isinstance(engine, dict) or not engine.get("name") or engine.get("name") == DEFAULT_ENGINE:
        return default_engine()
    name, version = str(engine["name"])[:64], str(engine.get("version") or "")[:64]
    rows = {e.version: e for e in Engine.objects.filter(name=name, version__in={version, ""})}
    found = rows.get(version) or rows.get("")
    if found is None:
        found, _ = Engine.objects.get_or_create(name=name, version=version,
                                                defaults={"notes": "recreated from a job's spec"})
    return found


def engine_jobs_q(engine: Engine, prefix: str = "") -> Q:
    """The jobs (``prefix`` "job__" for their results) whose evidence is ``engine``'s cell (``engine_for_spec``'s
    rule, as a query)."""
    name, version = f"{prefix}spec__engine__name", f"{prefix}spec__engine__version"
    if engine.default:
        return Q(**{f"{prefix}spec__engine__isnull": True}) | Q(**{name: engine.name})
    if engine.version:
        return Q(**{name: engine.name, version: engine.version})
    others = list(Engine.objects.filter(name=engine.name).exclude(version="").values_list("version", flat=True))
    return Q(**{name: engine.name}) & ~Q(**{f"{version}__in": others}) if others else Q(**{name: engine.name})


def version_key(version: str) -> tuple[Any, ...]:
    """Orders engine versions as people read them: "0.10.0" after "0.9.2" (numbers as numbers, text after)."""
    return tuple((0, int(p), "") if p.isdecimal() else (1, 0, p) for p in re.split(r"[.\-+_]", version or "") if p)


def parse_engine_filter(raw: str | None) -> tuple[str, str | None] | None:
    """A ``?engine=`` parameter: ``NAME`` (every version) or ``NAME@VERSION``; None when blank. A malformed one
    raises ``ValueError`` naming what is accepted."""
    raw = (raw or "").strip()
    if not raw:
        return None
    return parse_ref(raw)
