"""The stage report's sections, defined once: per stage the keys its section must hold (more may be added) and
the type of each value it names, read by the pipeline before it posts a section (``agents.pipeline.runner``) and
by the portal when it ingests one (``apps.evidence.services.parse_stage_section``).

Two checks, each naming the bad value by its path in the report (``stages.<stage>.<key>``, ``…[i]`` for a row):

- ``section_problems``: a key the contract names is absent. The pipeline refuses such a section (a stage that
  returns it has a bug); the portal stores it, judged *incomplete* (never passing), so that a partial report
  from an older agent still counts for what it shows.
- ``type_problems``: a value is present (not null) but of the wrong type. Both sides refuse it with the same
  sentence: the portal answers 400 ``{path: [message]}`` and stores nothing; the pipeline fails the stage with
  ``path: message`` and posts nothing of it.

The types are those the portal has always read the values with: a text field takes a number (stored as its
text), an integer field takes an integral float, null is "not measured". Bounds (ranges, lengths, how many
rows) stay with the portal, which owns what it stores."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from contract.quant_cost import TYPES as E2E_ORIGINAL_TYPES

TOP_LEVEL_KEYS: tuple[str, ...] = ("model", "hardware", "dtype", "tier", "failed_stage", "error", "stages")
MODEL_KEYS: tuple[str, ...] = ("name", "architecture", "path")

# stage -> keys its section must hold (more may be added); a stage that raised leaves no section.
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "plan": ("params_total", "params_active", "weight_bytes", "kv_bytes_per_token", "plan", "fits",
             "bytes_per_device"),
    "load": ("ok", "tensors", "bytes", "seconds", "gb_per_s", "peak_rss_bytes", "shards", "problems"),
    "inventory": ("ops", "summary"),
    "align": ("passed", "thresholds", "layers", "e2e"),  # "ops" and "kv_cache" when their modules exist
    "serve": ("ready_seconds", "endpoint", "text_path_ok"),
    "bench": ("runs",),
    "eval": ("passed",),
    "comm": ("ranks", "collectives"),
    "env": ("runtime_commit", "torch", "python", "device", "device_count", "dispatch_key", "driver"),
    "conformance": ("template_declares_tools", "repeats", "checks", "passed"),  # contract/conformance.py
    # docs/references.md
    "reference": ("pool_version", "nonce", "top_k", "e2e", "mc", "qa", "ppl", "needle", "code", "agent"),
}
# an external engine's align section (``method`` "endpoint", contract/endpoint_align.py) owes these instead
ENDPOINT_ALIGN_KEYS: tuple[str, ...] = ("passed", "thresholds", "engine", "e2e", "kv_self")
NESTED_KEYS: dict[tuple[str, str], tuple[str, ...]] = {
    ("plan", "plan"): ("tp", "pp", "ep", "devices"),
    ("inventory", "summary"): ("native", "decomposed", "fallback", "missing"),
    ("align", "e2e"): ("prompts", "tokens", "token_match_rate", "divergences", "perplexity_ref",
                       "perplexity_target"),
    ("align", "kv_cache"): ("lengths", "max_abs_err", "passed"),
}
ROW_KEYS: dict[tuple[str, str], tuple[str, ...]] = {
    ("load", "shards"): ("file", "sha256"),
    ("load", "problems"): ("tensor", "problem"),
    ("inventory", "ops"): ("op", "count", "dtypes", "status", "decomposes_to"),
    ("align", "ops"): ("op", "cosine", "max_rel_err", "max_abs_err", "passed"),
    ("align", "layers"): ("layer", "cosine", "max_rel_err", "passed"),
    ("comm", "collectives"): ("op", "dtype", "ok", "sizes"),
    ("conformance", "checks"): ("check", "passed", "detail", "target", "reference"),
}
DIVERGENCE_KEYS: tuple[str, ...] = ("prompt", "position", "ref_token", "target_token", "ref_top5", "target_top5",
                                    "near_tie")

INT, NUM, BOOL, TEXT, OBJ, LIST = "integer", "number", "boolean", "text", "object", "list"
_LATENCY = {f"{m}_ms": OBJ for m in ("ttft", "tpot", "itl", "e2e")}

# the type of each value a section names, where present: the section's own keys ...
SECTION_TYPES: dict[str, dict[str, str]] = {
    "plan": {"params_total": INT, "params_active": INT, "weight_bytes": INT, "kv_bytes_per_token": INT, "plan": OBJ,
             "fits": BOOL, "bytes_per_device": INT, "max_context": INT, "max_batch": INT, "dtype": TEXT},
    "load": {"ok": BOOL, "tensors": INT, "bytes": INT, "seconds": NUM, "gb_per_s": NUM, "peak_rss_bytes": INT,
             "shards": LIST, "problems": LIST},
    "inventory": {"ops": LIST},
    "align": {"passed": BOOL, "thresholds": OBJ, "ops": LIST, "layers": LIST, "e2e": OBJ, "kv_cache": OBJ,
              "e2e_original": OBJ},
    "serve": {"ready_seconds": NUM, "endpoint": TEXT, "text_path_ok": BOOL, "chat_path_ok": BOOL,
              "image_path_ok": BOOL, "has_chat_template": BOOL, "template_declares_tools": BOOL},
    "bench": {"peak_memory_bytes": INT},  # "runs" is required as a list: the portal names the levels it wants
    "eval": {"passed": BOOL, "needle": OBJ},
    "comm": {"ranks": INT, "collectives": LIST},
    "env": {"runtime_commit": TEXT, "torch": TEXT, "python": TEXT, "device": TEXT, "device_count": INT,
            "dispatch_key": TEXT, "driver": TEXT},
    "conformance": {"template_declares_tools": BOOL, "thinking": BOOL, "repeats": INT, "checks": LIST,
                    "passed": BOOL, "tool_call_parser": TEXT, "reasoning_parser": TEXT},
    "soak": {"passed": BOOL, "seconds": NUM, "memory_slope": NUM, "recover_seconds": NUM, "crashes": INT,
             "windows": LIST},
}
# ... the keys of an object it holds ...
NESTED_TYPES: dict[tuple[str, str], dict[str, str]] = {
    ("plan", "plan"): {"tp": INT, "pp": INT, "ep": INT, "devices": INT},
    ("align", "e2e"): {"prompts": INT, "tokens": INT, "token_match_rate": NUM, "perplexity_ref": NUM,
                       "perplexity_target": NUM, "divergences": LIST},
    ("align", "kv_cache"): {"passed": BOOL, "max_abs_err": NUM, "lengths": LIST},
    ("align", "e2e_original"): E2E_ORIGINAL_TYPES,  # a quantised release against its original (contract/quant_cost.py)
    ("eval", "needle"): {"lengths": LIST, "depths": LIST, "reference": LIST, "target": LIST},
}
# ... and the keys of each row of a list it holds (every row an object)
ROW_TYPES: dict[tuple[str, str], dict[str, str]] = {
    ("load", "shards"): {"file": TEXT, "sha256": TEXT},
    ("load", "problems"): {"tensor": TEXT, "problem": TEXT},
    ("inventory", "ops"): {"op": TEXT, "count": INT, "dtypes": LIST, "status": TEXT, "decomposes_to": LIST},
    ("align", "ops"): {"op": TEXT, "cosine": NUM, "max_rel_err": NUM, "max_abs_err": NUM, "passed": BOOL},
    ("align", "layers"): {"layer": INT, "cosine": NUM, "max_rel_err": NUM, "passed": BOOL},
    ("bench", "runs"): {"concurrency": INT, "output_tok_s": NUM, "req_s": NUM, "failed": INT,
                        "peak_memory_bytes": INT, **_LATENCY},
    ("comm", "collectives"): {"op": TEXT, "dtype": TEXT, "ok": BOOL, "sizes": LIST},
    ("eval", "tasks"): {"task": TEXT, "reference": NUM, "target": NUM, "n": INT},
    ("soak", "windows"): {"t": NUM, "output_tok_s": NUM, "rss_bytes": INT},
    ("conformance", "checks"): {"check": TEXT, "passed": BOOL, "detail": TEXT},
}
DIVERGENCE_TYPES: dict[str, str] = {"prompt": INT, "position": INT, "ref_token": INT, "target_token": INT,
                                    "ref_top5": LIST, "target_top5": LIST, "near_tie": BOOL}


def type_message(kind: str, value: Any) -> str | None:
    """Why ``value`` (not null) is not of ``kind``, in the portal's words; None when it is."""
    name = type(value).__name__
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == INT:
        ok = is_number and (isinstance(value, int) or value.is_integer())
        return None if ok else f"must be an integer, got {name}"
    if kind == NUM:
        return None if is_number else f"must be a number, got {name}"
    if kind == BOOL:
        return None if isinstance(value, bool) else f"must be true or false, got {name}"
    if kind == TEXT:
        return None if is_number or isinstance(value, str) else f"must be a string, got {name}"
    if kind == OBJ:
        return None if isinstance(value, Mapping) else "must be an object"
    if kind == LIST:
        return None if isinstance(value, list) else "must be a list"
    raise ValueError(f"unknown kind {kind!r}")


def _typed(values: Mapping[str, Any], types: Mapping[str, str], at: str) -> Iterator[tuple[str, str]]:
    for key, kind in types.items():
        value = values.get(key)
        if value is not None and (message := type_message(kind, value)) is not None:
            yield f"{at}.{key}", message


def _rows(rows: Any, types: Mapping[str, str], at: str) -> Iterator[tuple[str, str]]:
    for i, row in enumerate(rows if isinstance(rows, list) else ()):
        if not isinstance(row, Mapping):
            yield f"{at}[{i}]", "must be an object"
        else:
            yield from _typed(row, types, f"{at}[{i}]")


def type_problems(stage: str, section: Mapping[str, Any], path: str | None = None) -> list[tuple[str, str]]:
    """Every value of ``section`` of the wrong type, as ``(path, message)``; ``path`` is the section's own
    (``stages.<stage>`` by default). Keys the contract does not type are not looked at."""
    at = path or f"stages.{stage}"
    found = list(_typed(section, SECTION_TYPES.get(stage, {}), at))
    bad = {p for p, _ in found}
    for (owner, key), types in NESTED_TYPES.items():
        if owner == stage and isinstance(section.get(key), Mapping) and f"{at}.{key}" not in bad:
            found += _typed(section[key], types, f"{at}.{key}")
    for (owner, key), types in ROW_TYPES.items():
        if owner == stage and f"{at}.{key}" not in bad:
            found += _rows(section.get(key), types, f"{at}.{key}")
    e2e = section.get("e2e")
    if stage == "align" and isinstance(e2e, Mapping) and isinstance(e2e.get("divergences"), list):
        found += _rows(e2e["divergences"], DIVERGENCE_TYPES, f"{at}.e2e.divergences")
    return found


def section_problems(stage: str, section: Mapping[str, Any]) -> list[str]:
    """The keys the contract names that ``section`` lacks, by path (``align.e2e.prompts``, ``load.shards[0].file``).
    A section saying the stage is not applicable (``{"applicable": false, "reason": …}``: an external engine's
    internals) owes only its reason."""
    if section.get("applicable") is False:
        return [] if section.get("reason") else [f"{stage}.reason"]
    wanted_keys = SECTION_KEYS.get(stage, ())
    if stage == "align" and section.get("method") == "endpoint":  # an external engine: no ops or layers to show
        wanted_keys = ENDPOINT_ALIGN_KEYS
    problems = [f"{stage}.{key}" for key in wanted_keys if key not in section]
    for (owner, key), wanted in NESTED_KEYS.items():
        if owner == stage and isinstance(section.get(key), Mapping):
            problems += [f"{stage}.{key}.{k}" for k in wanted if k not in section[key]]
    for (owner, key), wanted in ROW_KEYS.items():
        if owner == stage and isinstance(section.get(key), list):
            for i, row in enumerate(section[key]):
                problems += [f"{stage}.{key}[{i}].{k}" for k in wanted if isinstance(row, Mapping) and k not in row]
    if stage == "align" and isinstance(section.get("e2e"), Mapping):
        for i, row in enumerate(section["e2e"].get("divergences") or []):
            problems += [f"align.e2e.divergences[{i}].{k}" for k in DIVERGENCE_KEYS
                         if isinstance(row, Mapping) and k not in row]
    return problems
