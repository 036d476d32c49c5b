"""The stage report (DESIGN.md §6): its required keys, validation, JSON safety, and the one-line reason a
stage's section is not passing evidence."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

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
    "reference": ("pool_version", "nonce", "top_k", "e2e", "mc", "qa", "ppl", "needle"),  # docs/references.md
}
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
}
DIVERGENCE_KEYS: tuple[str, ...] = ("prompt", "position", "ref_token", "target_token", "ref_top5", "target_top5",
                                    "near_tie")


def section_problems(stage: str, section: Mapping[str, Any]) -> list[str]:
    """Contract violations of one stage's section: missing keys, named by path. A section saying the stage is
    not applicable (``{"applicable": false, "reason": …}``, an external engine's internals) owes only its reason."""
    if section.get("applicable") is False:
        return [] if section.get("reason") else [f"{stage}.reason"]
    problems = [f"{stage}.{key}" for key in SECTION_KEYS.get(stage, ()) if key not in section]
    for (owner, key), wanted in NESTED_KEYS.items():
        if owner == stage and isinstance(section.get(key), Mapping):
            problems += [f"{stage}.{key}.{k}" for k in wanted if k not in section[key]]
    for (owner, key), wanted in ROW_KEYS.items():
        if owner == stage and isinstance(section.get(key), list):
            for i, row in enumerate(section[key]):
                problems += [f"{stage}.{key}[{i}].{k}" for k in wanted if k not in row]
    if stage == "align" and isinstance(section.get("e2e"), Mapping):
        for i, row in enumerate(section["e2e"].get("divergences") or []):
            problems += [f"align.e2e.divergences[{i}].{k}" for k in DIVERGENCE_KEYS if k not in row]
    return problems


def report_problems(report: Mapping[str, Any]) -> list[str]:
    """Contract violations of a whole report (top-level keys, the model block, every section present)."""
    problems = [key for key in TOP_LEVEL_KEYS if key not in report]
    model = report.get("model")
    if isinstance(model, Mapping):
        problems += [f"model.{key}" for key in MODEL_KEYS if key not in model]
    tier = report.get("tier")
    if not isinstance(tier, int) or not 0 <= tier <= 6:
        problems.append(f"tier (got {tier!r}, expected 0-6)")
    for stage, section in (report.get("stages") or {}).items():
        if isinstance(section, Mapping):
            problems += section_problems(stage, section)
    return problems


def json_safe(value: Any) -> Any:
    """A copy that ``json.dumps`` accepts and PostgreSQL stores: non-finite floats become None, tuples and
    sets become lists, numbers from numpy/torch become Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [json_safe(v) for v in items]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return json_safe(value.item())  # numpy / torch scalars
    return str(value)


def failure_reason(stage: str, section: Mapping[str, Any]) -> str:
    """Why a section that returned normally is not passing evidence, in one line."""
    if section.get("error"):
        return str(section["error"])
    if stage == "plan":
        per_device = section.get("bytes_per_device")
        plan = section.get("plan") or {}
        return (f"the model does not fit: the best plan (tp={plan.get('tp')}, pp={plan.get('pp')}, "
                f"ep={plan.get('ep')}) needs {per_device} bytes per device")
    if stage == "load":
        problems = section.get("problems") or []
        shown = "; ".join(f"{p.get('tensor') or p.get('file')}: {p.get('problem')}" for p in problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        return f"weights failed verification: {shown}{more}" if problems else "weights failed verification"
    if stage == "align":
        return align_failure_reason(section)
    if stage == "serve":
        return f"the text path did not answer through {section.get('endpoint') or 'the server'}"
    if stage == "bench":
        return "no benchmark run produced output tokens"
    if stage == "eval":
        return str(section.get("summary") or "task quality is outside tolerance of the reference")
    return f"{stage} did not pass"


def align_failure_reason(section: Mapping[str, Any]) -> str:
    reasons: list[str] = []
    bad_ops = [row for row in section.get("ops") or [] if row.get("status") != "unchecked" and not row.get("passed")]
    if bad_ops:
        shown = [f"{row['op']} ({row.get('module') or '?'} at {row.get('where') or '?'}"
                 + (f": {row['problem']})" if row.get("problem") else ")") for row in bad_ops[:5]]
        reasons.append(f"operators out of threshold: {', '.join(shown)}")
    if section.get("missing"):
        reasons.append(f"incomplete: no {', '.join(map(str, section['missing']))} evidence")
    elif isinstance(section.get("ops"), list) and not any(
            row.get("status") != "unchecked" for row in section["ops"]) and section.get("checks", {}).get("ops") is False:
        reasons.append("no operator of the runtime was checked")
    bad_layers = [row for row in section.get("layers") or [] if not row.get("passed")]
    if bad_layers:
        first = bad_layers[0]
        cosine = first.get("cosine")
        shown = f"cosine {cosine:.6f}" if isinstance(cosine, float) else first.get("problem", "no comparison")
        reasons.append(f"{len(bad_layers)} layer(s) below the cosine threshold, first layer {first['layer']} ({shown})")
    e2e = section.get("e2e") or {}
    hard = [d for d in e2e.get("divergences") or [] if not d.get("near_tie")]
    if hard:
        d = hard[0]
        reasons.append(f"greedy decode diverged beyond a near-tie: prompt {d['prompt']} position {d['position']} "
                       f"(reference token {d['ref_token']}, target token {d['target_token']}); "
                       f"token match rate {e2e.get('token_match_rate')}")
    elif e2e.get("hard_divergences"):
        reasons.append(f"greedy decode diverged beyond a near-tie at {e2e['hard_divergences']} step(s); "
                       f"token match rate {e2e.get('token_match_rate')}")
    if e2e.get("perplexity_passed") is False:
        reasons.append(f"perplexity {e2e.get('perplexity_target'):.4g} vs reference {e2e.get('perplexity_ref'):.4g}")
    for key, error in (section.get("part_errors") or {}).items():
        reasons.append(f"the {key} check could not run ({error})")
    kv = section.get("kv_cache")
    if isinstance(kv, Mapping) and not kv.get("passed"):
        reasons.append(f"KV-cache consistency failed (max abs err {kv.get('max_abs_err')})")
    return "alignment failed: " + "; ".join(reasons) if reasons else "alignment failed"
