"""Serving engines as the portal names them and the agents start them: the reference syntax (``NAME`` or
``NAME@VERSION``), the launch command's placeholders, and which stages an external engine cannot run.

The bundled runtime is the engine ``day0`` (``DEFAULT_ENGINE``): a job that names no engine runs it, exactly as
before engines existed. Any other engine is *external*: the agent starts its command (the catalog's template with
the placeholders filled, or the submitter's own command for ``openai-compatible``) and the stages talk to it
through its OpenAI-compatible endpoint only. Pure: no Django, no torch."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

DEFAULT_ENGINE = "day0"  # the bundled runtime
GENERIC_ENGINE = "openai-compatible"  # any OpenAI-compatible server: the submitter gives the command
PLACEHOLDERS = ("model_path", "port", "dtype", "tp", "pp", "ep", "max_model_len", "extra")
CAPABILITIES = ("logprobs", "prompt_logprobs", "images", "tools", "structured_output")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
MAX_COMMAND = 4000

# stages that read the bundled runtime's internals: not applicable to an external engine, whose evidence for
# them is the endpoint checks named here (docs/engines.md)
INTERNAL_STAGES: dict[str, str] = {
    "inventory": "the operator inventory hooks the bundled runtime's modules; an external engine's are not visible",
    "align": "operator and layer align read the bundled runtime's activations; an external engine's align is "
             "endpoint align instead (end to end through its endpoint and the KV-cache self-consistency check, "
             "contract/endpoint_align.py)",
}


def parse_ref(ref: str) -> tuple[str, str | None]:
    """``NAME`` or ``NAME@VERSION`` as (name, version or None); ``ValueError`` naming what is wrong."""
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError("an engine is named NAME or NAME@VERSION")
    name, _, version = ref.strip().partition("@")
    if not NAME_RE.match(name):
        raise ValueError(f"engine name {name!r} must be lowercase letters, digits, '.', '_' or '-'")
    if version and not VERSION_RE.match(version):
        raise ValueError(f"engine version {version!r} is not a version")
    return name, version or None


def is_external(engine: Mapping[str, Any] | None) -> bool:
    """Whether a job spec's ``engine`` names an engine other than the bundled runtime."""
    return bool(engine) and engine.get("name", DEFAULT_ENGINE) != DEFAULT_ENGINE


def check_template(template: str) -> None:
    """``ValueError`` for a command template with an unknown placeholder, or one that does not split."""
    if len(template) > MAX_COMMAND:
        raise ValueError(f"a command is at most {MAX_COMMAND} characters")
    for name in re.findall(r"\{([^{}]*)\}", template):
        if name not in PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {{{name}}}; placeholders are "
                             + ", ".join("{" + p + "}" for p in PLACEHOLDERS))
    try:
        shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"the command does not split into words: {exc}") from None


def render_command(template: str, values: Mapping[str, Any]) -> list[str]:
    """The argv of ``template``: split as a shell would, then each placeholder filled (``{extra}`` may stand
    alone as a word and expands to the extra flags, split); a placeholder without a value becomes '', and a word
    that is only such a placeholder after a ``--flag`` drops the flag too (``--max-model-len {max_model_len}``
    with no length: the engine's own default)."""
    check_template(template)
    argv: list[str] = []
    for word in shlex.split(template):
        if word == "{extra}":
            argv += shlex.split(str(values.get("extra") or ""))
            continue
        lone = re.fullmatch(r"\{([a-z_]+)\}", word)
        if lone and not str(values.get(lone.group(1), "") or "") and argv and argv[-1].startswith("--") \
                and "=" not in argv[-1]:
            argv.pop()
            continue
        argv.append(re.sub(r"\{([a-z_]+)\}", lambda m: str(values.get(m.group(1), "") or ""), word))
    return [a for a in argv if a != ""]


def check_spec_engine(engine: Any) -> dict[str, Any] | None:
    """A job spec's ``engine`` object ``{name, version, command}`` (each a string; command optional), or None;
    ``ValueError`` (prefixed by the key) for anything else."""
    if engine is None:
        return None
    if not isinstance(engine, Mapping):
        raise ValueError(f"must be an object {{name, version, command}}, got {type(engine).__name__}")
    for key in ("name", "version", "command"):
        if engine.get(key) is not None and not isinstance(engine[key], str):
            raise ValueError(f"{key} must be a string, got {type(engine[key]).__name__}")
    parse_ref(engine.get("name") or "")
    if engine.get("command"):
        check_template(engine["command"])
    return dict(engine)
