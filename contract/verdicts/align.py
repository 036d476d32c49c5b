"""The align stage's verdict: operators, layers, end to end, KV cache and (for a model that takes images) the
vision encoder, each recomputed from the rows in the section. Pure: no Django, no torch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from contract.verdicts.base import PASS, Context, Verdict
from contract.verdicts.base import number as _number
from contract.verdicts.base import text as _text
from contract.verdicts.endpoint import external, judge_endpoint_align

# --- align -----------------------------------------------------------------------------------------------

def _token_ids(top: Any) -> set[Any]:
    """Token ids of a top-k list: [{"token", ...}] or [[token, logprob], ...]."""
    out = set()
    for item in top if isinstance(top, list) else []:
        if isinstance(item, Mapping):
            out.add(item.get("token"))
        elif isinstance(item, list | tuple) and item:
            out.add(item[0])
    return out


# a lookup (the embedding) copies stored values: it may be exact at any precision
EXACT_CHECKS = frozenset({"embedding"})
REDUCED_DTYPES = frozenset({"bfloat16", "float16", "float8_e4m3fn", "int8", "int4", "mxfp4"})
COSINE_SLACK = 1e-9  # float64 rounding of a cosine of equal vectors


def reduced_dtype(dtype: Any, config: Mapping[str, Any] | None) -> str | None:
    """The canonical name of ``dtype`` (``"auto"``: the checkpoint's) when it is a reduced precision, else None."""
    if not isinstance(dtype, str) or not dtype:
        return None
    from contract.planner.memory import resolve_dtype

    try:
        name, _ = resolve_dtype(dtype, dict(config or {}))
    except ValueError:
        return None
    return name if name in REDUCED_DTYPES or name != "float32" else None


def _row_ranges(v: Verdict, row: Mapping[str, Any], label: str, cosine: float, reduced: str | None) -> None:
    """A cosine lies in [−1, 1] and errors are at least 0; an error of exactly 0 at a reduced precision is no
    measurement (a reference compared with itself)."""
    if not -1 - COSINE_SLACK <= cosine <= 1 + COSINE_SLACK:
        v.fail(f"{label} cosine {_text(cosine)} is outside [-1, 1]")
    errors = {k: _number(row.get(k)) for k in ("max_rel_err", "max_abs_err") if row.get(k) is not None}
    for k, value in errors.items():
        if value is None or value < 0:
            v.fail(f"{label} {k} {_text(row.get(k))} is not an error (a number of at least 0)")
    exact = str(row.get("check") or row.get("op") or "").split(" ")[0] in EXACT_CHECKS
    dtype = reduced_dtype(row.get("dtype"), None) if row.get("dtype") else reduced
    if dtype and not exact and errors and all(value == 0 for value in errors.values()):
        v.fail(f"{label}: exactly zero error at {dtype} is not a measurement")


def _align_rows(v: Verdict, rows: Any, part: str, key: str, cos_key: str, rel_key: str | None,
                t: Mapping[str, float], reduced: str | None = None) -> int:
    if not isinstance(rows, list) or not rows:
        v.missing(f"{part} missing")
        return 0
    checked = 0
    for row in rows:
        name = row.get(key) if isinstance(row, Mapping) else None
        if not isinstance(row, Mapping):
            v.missing(f"{part}: a row is not an object")
            continue
        if row.get("status") == "unchecked":
            v.note(f"{part} {name} unchecked")
            continue
        cosine = _number(row.get("cosine"))
        rel = _number(row.get("max_rel_err"))
        label = f"layer {name}" if part == "layers" else f"{part[:-1]} {name}"
        if cosine is None:
            v.fail(f"{label} has no cosine ({row.get('problem') or 'not compared'})")
            continue
        checked += 1
        _row_ranges(v, row, label, cosine, reduced)
        if cosine < t[cos_key]:
            v.fail(f"{label} cosine {_text(cosine)} is below {_text(t[cos_key])}")
        if rel_key is not None and math.isfinite(t[rel_key]):
            if rel is None:
                v.fail(f"{label} has no max_rel_err")
            elif rel > t[rel_key]:
                v.fail(f"{label} max_rel_err {_text(rel)} is above {_text(t[rel_key])}")
    if not checked and v.status == PASS:
        v.missing(f"{part}: no row was checked")
    return checked


def _e2e(v: Verdict, e2e: Any, t: Mapping[str, float]) -> None:
    if not isinstance(e2e, Mapping) or not e2e:
        v.missing("e2e missing")
        return
    tokens, prompts = e2e.get("tokens"), e2e.get("prompts")
    divergences = e2e.get("divergences")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:
        v.missing("e2e tokens missing (the greedy tokens compared)")
        return
    if not isinstance(prompts, int) or isinstance(prompts, bool) or prompts <= 0:
        v.missing("e2e prompts missing")
    if not isinstance(divergences, list):
        v.missing("e2e divergences missing (an empty list when every token matched)")
        return
    k = int(t["e2e_top_k"])
    hard = 0
    for d in divergences:
        if not isinstance(d, Mapping):
            v.missing("e2e: a divergence is not an object")
            return
        ref_list, target_list = d.get("ref_top5") or [], d.get("target_top5") or []
        ref_top = _token_ids(ref_list[:k] if isinstance(ref_list, list) else [])
        target_top = _token_ids(target_list[:k] if isinstance(target_list, list) else [])
        near_tie = d.get("target_token") in ref_top and d.get("ref_token") in target_top
        if not near_tie:
            hard += 1
            if hard == 1:
                v.fail(f"e2e prompt {d.get('prompt')} position {d.get('position')}: target token "
                       f"{d.get('target_token')} vs reference {d.get('ref_token')} is not within each other's top-{k}"
                       + (" (claimed a near-tie)" if d.get("near_tie") else ""))
    if hard > 1:
        v.fail(f"e2e: {hard} divergences beyond a near-tie")
    recomputed = 1 - len(divergences) / tokens
    claimed_rate = _number(e2e.get("token_match_rate"))
    lowest = min(recomputed, claimed_rate) if claimed_rate is not None else recomputed
    if lowest < t["align_min_token_match"]:
        v.fail(f"e2e token match rate {lowest:.4f} is below the minimum {_text(t['align_min_token_match'])}")
    if claimed_rate is None:
        v.missing("e2e token_match_rate missing")
    elif round((1 - claimed_rate) * tokens) < len(divergences):  # compare token counts: rates may be rounded
        v.fail(f"e2e token_match_rate {claimed_rate:.4f} is above the {recomputed:.4f} recomputed from "
               f"{len(divergences)} divergences over {tokens} tokens")
    else:
        unrecorded = round((1 - claimed_rate) * tokens) - len(divergences)
        if unrecorded > 0:
            claimed_hard = e2e.get("hard_divergences")
            if not isinstance(claimed_hard, int) or isinstance(claimed_hard, bool):
                v.missing(f"e2e: {unrecorded} divergent steps are not recorded and hard_divergences is missing")
            elif claimed_hard > hard:
                v.fail(f"e2e: {claimed_hard} divergences beyond a near-tie")
            else:
                v.note(f"e2e: {unrecorded} divergent steps not recorded; judged on the recorded ones")
    ppl_ref, ppl_target = _number(e2e.get("perplexity_ref")), _number(e2e.get("perplexity_target"))
    if ppl_ref is None or ppl_target is None or ppl_ref <= 0:
        v.missing("e2e perplexity_ref and perplexity_target missing")
    else:
        rel = abs(ppl_target - ppl_ref) / ppl_ref
        if rel > t["perplexity_rel_tol"]:
            v.fail(f"e2e perplexity {_text(ppl_target)} vs reference {_text(ppl_ref)} differs by {rel:.4f}, above "
                   f"{_text(t['perplexity_rel_tol'])}")


def _kv(v: Verdict, kv: Any, t: Mapping[str, float], ctx: Context, path: str | None) -> None:
    if not isinstance(kv, Mapping) or not kv:
        v.missing("kv_cache missing")
        return
    lengths = kv.get("lengths")
    if kv.get("path") == "recompute" and lengths == [] and path == "fallback":
        v.note("kv_cache: the fallback path recomputes every step; no paged cache to check")
        return
    if not isinstance(lengths, list) or not lengths or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        v.missing("kv_cache lengths missing (the sequence lengths checked)")
        return
    context = ctx.model.context_length
    if context and max(lengths) > context:
        v.fail(f"kv_cache length {max(lengths)} is beyond the model's context {context}")
    if kv.get("blocks_freed") is False:
        v.fail("kv_cache: blocks were not all returned to the pool after the checks")
    # the gate is the scale-free relative error; the absolute error gates only reports that lack it
    rel = _number(kv.get("max_rel_err"))
    err = _number(kv.get("max_abs_err"))
    for key, value in (("max_rel_err", rel), ("max_abs_err", err)):
        if value is not None and value < 0:
            v.fail(f"kv_cache {key} {_text(value)} is not an error (a number of at least 0)")
    if rel is not None:
        if rel > t["kv_cache_max_rel_err"]:
            v.fail(f"kv_cache max_rel_err {_text(rel)} is above {_text(t['kv_cache_max_rel_err'])}")
    elif err is None:
        v.missing("kv_cache max_rel_err and max_abs_err missing")
    elif err > t["kv_cache_max_abs_err"]:
        v.fail(f"kv_cache max_abs_err {_text(err)} is above {_text(t['kv_cache_max_abs_err'])}")


def runtime_path(ctx: Context) -> tuple[str | None, str]:
    """Which code runs the model, decided by the portal from the config (``contract.model.native``, the list of
    native families the registry asserts against), and how it was decided; the load section's word only when
    the config is not known."""
    config = ctx.model.config
    if config:
        from contract.model.native import config_runtime_path

        try:
            return config_runtime_path(dict(config))[0], "the config"
        except ValueError:
            pass
    return ctx.model.runtime_path, "the load section"


def _align(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    if external(ctx) or s.get("method") == "endpoint":  # an external engine: endpoint align replaces the rest
        judge_endpoint_align(v, s, t, ctx, _e2e)
        return
    path, source = runtime_path(ctx)
    config = ctx.model.config or {}
    if source == "the config" and ctx.model.runtime_path and ctx.model.runtime_path != path:
        arch = (config.get("architectures") or ["?"])[0]
        v.fail(f"the load section says the {ctx.model.runtime_path} path, but the runtime runs {arch} on the "
               f"{path} path (decided from the config)")
    reduced = reduced_dtype(ctx.dtype, config)
    ops = s.get("ops")
    unchecked_only = isinstance(ops, list) and all(isinstance(r, Mapping) and r.get("status") == "unchecked"
                                                   for r in ops)
    if path == "fallback" and unchecked_only:
        # the transformers fallback runs none of the runtime's own operators: layers and e2e carry the proof
        v.note(f"ops: the model runs on the fallback path; {len(ops)} module(s) unchecked, none of the runtime's")
    else:
        checked = _align_rows(v, ops, "ops", "op", "op_cosine", "op_max_rel_err", t, reduced)
        if checked and checked < t["align_min_ops"]:
            v.fail(f"ops: {checked} operator check(s), a native model's alignment runs at least "
                   f"{int(t['align_min_ops'])}")
        _coverage(v, s, ops, ctx)
    layers = s.get("layers")
    _align_rows(v, layers, "layers", "layer", "layer_cosine", "layer_max_rel_err", t, reduced)
    declared = config.get("num_hidden_layers") or (config.get("text_config") or {}).get("num_hidden_layers")
    if isinstance(layers, list) and layers and isinstance(declared, int):
        seen = {row.get("layer") for row in layers if isinstance(row, Mapping)}
        absent = [i for i in range(declared) if i not in seen]
        if len(layers) != declared:
            v.fail(f"layers: {len(layers)} compared, the model has {declared}")
        elif absent:
            v.fail(f"layers: decoder layer(s) {absent[:8]} not compared (the model has {declared})")
    if ctx.challenge is not None:  # the portal: its scores of the raw outputs against the reference it holds
        ctx.challenge(v, "align", s, t)
    else:
        v.note("e2e: judged from the agent's own numbers: no portal reference")
        _e2e(v, s.get("e2e"), t)
    _kv(v, s.get("kv_cache"), t, ctx, path)
    if ctx.model.takes_images:
        _vision(v, s.get("vision"), t)
    block = s.get("compile")
    if isinstance(block, Mapping) and (block.get("enabled") is not False or any(
            block.get(k) for k in ("rows", "equal"))):  # judged unless it ran eager and claims no comparison
        _compiled(v, block)
    for part, error in (s.get("part_errors") or {}).items() if isinstance(s.get("part_errors"), Mapping) else ():
        v.fail(f"the {part} check could not run ({error})")


def _coverage(v: Verdict, s: Mapping[str, Any], ops: Any, ctx: Context) -> None:
    """Each operator of the job's inventory is run by a checked operator row (its ``aten_ops``) or listed in
    ``inventory_coverage.not_exercised`` with a reason (``not_exercised_reasons``)."""
    inventory = ctx.inventory_ops
    if inventory is None:
        v.note("ops: coverage of the inventory not measured (the job has no inventory section)")
        return
    exercised = {str(name) for row in ops if isinstance(row, Mapping) and row.get("status") != "unchecked"
                 for name in (row.get("aten_ops") if isinstance(row.get("aten_ops"), list) else [])}
    block = s.get("inventory_coverage") if isinstance(s.get("inventory_coverage"), Mapping) else {}
    reasons = block.get("not_exercised_reasons") if isinstance(block.get("not_exercised_reasons"), Mapping) else {}
    uncovered = [op for op in dict.fromkeys(map(str, inventory))
                 if op not in exercised and not (isinstance(reasons.get(op), str) and reasons[op].strip())]
    if uncovered:
        more = f" and {len(uncovered) - 5} more" if len(uncovered) > 5 else ""
        v.fail(f"ops: {len(uncovered)} operator(s) of the inventory have no align check and no reason: "
               f"{', '.join(uncovered[:5])}{more}")
    else:
        v.note(f"ops: {len(exercised & set(map(str, inventory)))} of {len(set(inventory))} inventory operators "
               "run by an operator check, the rest listed with a reason")


def _vision(v: Verdict, vision: Any, t: Mapping[str, float]) -> None:
    """A model that takes images: its encoder and projector rows within thresholds, and every image prompt's
    greedy tokens equal to the reference's (recomputed from both token lists, not the row's ``match``)."""
    if not isinstance(vision, Mapping) or not vision:
        v.missing("vision missing (the image encoder and projector were not compared)")
        return
    rows = vision.get("rows")
    if not isinstance(rows, list) or not rows:
        v.missing("vision rows missing")
    else:
        for row in rows:
            if not isinstance(row, Mapping):
                v.missing("vision: a row is not an object")
                continue
            label = f"vision {row.get('part')} (image {row.get('image')})"
            cosine, rel = _number(row.get("cosine")), _number(row.get("rel_err"))
            if cosine is None or rel is None:
                v.missing(f"{label}: cosine or rel_err missing")
                continue
            if cosine < t["vision_min_cosine"]:
                v.fail(f"{label} cosine {_text(cosine)} is below {_text(t['vision_min_cosine'])}")
            if rel > t["vision_max_rel_err"]:
                v.fail(f"{label} rel_err {_text(rel)} is above {_text(t['vision_max_rel_err'])}")
    prompts = vision.get("e2e")
    if not isinstance(prompts, list) or not prompts:
        v.missing("vision e2e missing (no image prompt decoded)")
        return
    for i, row in enumerate(prompts):
        ref = row.get("reference") if isinstance(row, Mapping) else None
        got = row.get("target") if isinstance(row, Mapping) else None
        if not isinstance(ref, list) or not isinstance(got, list) or not ref:
            v.missing(f"vision e2e prompt {i}: reference and target tokens missing")
        elif ref != got:
            at = _first_divergence(ref, got)
            at = min(len(ref), len(got)) if at is None else at
            v.fail(f"vision e2e prompt {i}: greedy tokens differ from the reference at position {at}")


def _compiled(v: Verdict, block: Mapping[str, Any]) -> None:
    """The compiled path's greedy tokens against eager ones on the same weights (a job that asked for it):
    recomputed from both token lists; past a first divergence only a near-tie passes (each side's token within
    the other's top-k ids recorded at that position)."""
    rows = block.get("rows")
    if not isinstance(rows, list) or not rows:
        v.missing("compile rows missing (compiled and eager tokens were not compared)")
        return
    for i, row in enumerate(rows):
        eager = row.get("eager") if isinstance(row, Mapping) else None
        got = row.get("compiled") if isinstance(row, Mapping) else None
        if not isinstance(eager, list) or not isinstance(got, list) or not eager:
            v.missing(f"compile prompt {i}: eager and compiled tokens missing")
            continue
        at = _first_divergence(eager, got)
        if at is None:
            if len(eager) != len(got):
                v.fail(f"compile prompt {i}: {len(got)} compiled tokens against {len(eager)} eager ones")
            continue
        tops = row.get("eager_top"), row.get("compiled_top")
        if all(isinstance(top, list) for top in tops) and got[at] in tops[0] and eager[at] in tops[1]:
            v.note(f"compile prompt {i}: a near-tie at position {at} (each token within the other's top-k)")
        else:
            v.fail(f"compile prompt {i}: compiled greedy tokens differ from eager ones at position {at}")


def _first_divergence(a: list, b: list) -> int | None:
    """First position where two token lists differ within their common length; None when one is a prefix."""
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
