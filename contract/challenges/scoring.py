"""How the portal scores an agent's raw outputs against the reference it holds (docs/references.md): end-to-end
greedy tokens (first divergence, each side's token within the other's top-k at it, token match rate, logprob
differences), multiple choice, exact match, perplexity and needles with Wilson intervals, the power rule that
sizes a challenge, and the checks that raw outputs answer exactly the drawn challenge.

Pure: standard library only (no torch, no Django); the portal imports it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

from contract.challenges import acting
from contract.suites import needle as eval_needle
from contract.suites import tasks as eval_tasks

Z95 = NormalDist().inv_cdf(0.975)
MAX_TEXT = 4096  # characters of one generated answer
MAX_TOKEN_ID = 1 << 31
LOGPROB_SLACK = 1e-4  # a log-probability may round a hair above 0
PROBABILITY_SLACK = 1e-3  # exclusive choices' probabilities may sum a hair above 1
RULE = ("n = ceil(((z(1-alpha)*sqrt(p0(1-p0)) + z(1-beta)*sqrt(p1(1-p1))) / theta)^2), p1 = p0 - theta, "
        "capped at the pool")


# --- statistics --------------------------------------------------------------------------------------------------

def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95 % by default) of ``successes`` of ``n`` trials; (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    return eval_tasks.wilson_low(successes, n, z), 1.0 - eval_tasks.wilson_low(n - successes, n, z)


def sample_size(p0: float, theta: float, alpha: float, beta: float, pool: int, minimum: int = 1) -> dict[str, Any]:
    """The items needed to detect a drop of ``theta`` from accuracy ``p0`` with a one-sided false-alarm rate
    ``alpha`` and miss rate ``beta`` (normal approximation), at least ``minimum``, capped at ``pool``."""
    if not (0 < theta <= 1 and 0 < alpha < 1 and 0 < beta < 1 and 0 <= p0 <= 1):
        raise ValueError(f"power rule needs 0 < theta <= 1, 0 < alpha, beta < 1, 0 <= p0 <= 1; got theta={theta}, "
                         f"alpha={alpha}, beta={beta}, p0={p0}")
    p1 = max(0.0, p0 - theta)
    z_a, z_b = NormalDist().inv_cdf(1 - alpha), NormalDist().inv_cdf(1 - beta)
    spread = z_a * math.sqrt(p0 * (1 - p0)) + z_b * math.sqrt(p1 * (1 - p1))
    wanted = max(minimum, math.ceil((spread / theta) ** 2 - 1e-9))
    return {"n": min(wanted, pool), "wanted": wanted, "capped": wanted > pool, "pool": pool, "p0": p0, "p1": p1,
            "theta": theta, "alpha": alpha, "beta": beta, "rule": RULE}


# --- checking raw outputs against the challenge ---------------------------------------------------------------

def _int(value: Any, low: int = 0, high: int = MAX_TOKEN_ID) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _logprob(value: Any) -> float | None:
    number = _num(value)
    return number if number is not None and number <= LOGPROB_SLACK else None


def _top_list(value: Any, top_k: int) -> str | None:
    """Why a top-logprob list is malformed (None when it is fine)."""
    if not isinstance(value, list) or not value or len(value) > top_k + 1:
        return f"each top_logprobs entry must be a list of 1 to {top_k + 1} {{token, logprob}} objects"
    for entry in value:
        if not isinstance(entry, Mapping) or not _int(entry.get("token")) or _logprob(entry.get("logprob")) is None:
            return "a top_logprobs entry is not {token: id, logprob: a number <= 0}"
    return None


def _item_problem(kind: str, raw: Mapping[str, Any], drawn: Mapping[str, Any], top_k: int) -> str | None:
    """Why one raw answer does not fit its drawn item (None when it does)."""
    if kind == "e2e":
        tokens, tops = raw.get("tokens"), raw.get("top_logprobs")
        limit = int(drawn.get("max_tokens") or 0)
        if not isinstance(tokens, list) or not all(_int(t) for t in tokens) or len(tokens) > limit:
            return f"tokens must be a list of at most {limit} token ids"
        if not isinstance(tops, list) or len(tops) != len(tokens):
            return f"top_logprobs must have one list per generated token ({len(tokens)})"
        return next((why for why in (_top_list(top, top_k) for top in tops) if why), None)
    if kind == "mc":
        lls, choices = raw.get("loglikelihoods"), drawn.get("choices") or []
        if not isinstance(lls, list) or len(lls) != len(choices) or any(_logprob(x) is None for x in lls):
            return f"loglikelihoods must be {len(choices)} numbers <= 0 (one per choice)"
        return None
    if kind in ("qa", "needle"):
        text = raw.get("text")
        return None if isinstance(text, str) and len(text) <= MAX_TEXT else f"text must be a string of at most {MAX_TEXT} characters"
    if kind == "ppl":
        if _logprob(raw.get("loglikelihood")) is None or not _int(raw.get("tokens"), 1):
            return "loglikelihood (a number <= 0) and tokens (a positive count) required"
        return None
    if kind in ("code", "agent"):
        return acting.item_problem(kind, raw, drawn)
    return f"unknown kind {kind}"


def _listed(ids: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def check_raw(kind: str, raw_items: Any, drawn: Sequence[Mapping[str, Any]], top_k: int
              ) -> tuple[dict[str, Mapping[str, Any]], list[str]]:
    """The raw answers of ``kind`` by id and the problems that make them incomplete: not a list, an item that
    is not an object or has no id, an id answered twice, ids that were not drawn, drawn ids not answered, and
    answers whose shape does not fit their item (each problem one sentence naming the ids)."""
    problems: list[str] = []
    if not isinstance(raw_items, list):
        return {}, [f"{kind} raw outputs missing (a list of answers, one per drawn item)"]
    wanted = {str(item["id"]): item for item in drawn}
    if len(raw_items) > 2 * len(wanted) + 16:
        return {}, [f"{kind}: {len(raw_items)} answers for {len(wanted)} drawn items"]
    by_id: dict[str, Mapping[str, Any]] = {}
    twice, unknown, malformed = [], [], []
    for raw in raw_items:
        item_id = raw.get("id") if isinstance(raw, Mapping) else None
        if not isinstance(item_id, str):
            problems.append(f"{kind}: an answer is not an object with an id")
            continue
        if item_id in by_id:
            twice.append(item_id)
        elif item_id not in wanted:
            unknown.append(item_id[:64])
        else:
            why = _item_problem(kind, raw, wanted[item_id], top_k)
            if why:
                malformed.append(f"{item_id}: {why}")
            by_id[item_id] = raw
    missing = [i for i in wanted if i not in by_id]
    if unknown:
        problems.append(f"{kind}: {len(unknown)} answer(s) to items that were not drawn ({_listed(unknown)})")
    if twice:
        problems.append(f"{kind}: item(s) answered twice ({_listed(twice)})")
    if missing:
        problems.append(f"{kind}: {len(missing)} of {len(wanted)} drawn items not answered ({_listed(missing)})")
    problems += [f"{kind} {why}" for why in malformed[:5]]
    if len(malformed) > 5:
        problems.append(f"{kind}: {len(malformed) - 5} more malformed answers")
    return by_id, problems


# --- end to end --------------------------------------------------------------------------------------------------

def top_ids(top: Any, k: int) -> set[int]:
    """The ids of the ``k`` most likely entries of a top-logprob list (the chosen token, listed first even when
    outside the top k, falls out when it is less likely than k others)."""
    entries = [e for e in top if isinstance(e, Mapping)] if isinstance(top, list) else []
    ranked = sorted(entries, key=lambda e: -(_num(e.get("logprob")) or -math.inf))
    return {e.get("token") for e in ranked[:k]}


def chosen_logprob(top: Any, token: int) -> float | None:
    """The logprob of ``token`` in a top-logprob list (None when it is not listed)."""
    for entry in top if isinstance(top, list) else []:
        if isinstance(entry, Mapping) and entry.get("token") == token:
            return _num(entry.get("logprob"))
    return None


def compare_e2e(ref: Mapping[str, Any], target: Mapping[str, Any], k: int) -> dict[str, Any]:
    """One prompt: tokens compared up to the first divergence (inclusive). ``outcome`` is ``match`` (every
    compared token equal), ``near-tie`` (the first divergence has each side's token within the other's top-k) or
    ``diverged``; a target that stops before the reference without diverging is ``short``. Past a divergence
    nothing is compared. Logprob differences of the chosen tokens at matched positions."""
    ref_tokens, tgt_tokens = list(ref.get("tokens") or []), list(target.get("tokens") or [])
    ref_top, tgt_top = list(ref.get("top_logprobs") or []), list(target.get("top_logprobs") or [])
    diffs: list[float] = []
    for j, (a, b) in enumerate(zip(ref_tokens, tgt_tokens, strict=False)):
        if a != b:
            near = (j < len(ref_top) and j < len(tgt_top) and b in top_ids(ref_top[j], k)
                    and a in top_ids(tgt_top[j], k))
            return {"compared": j + 1, "matched": j, "outcome": "near-tie" if near else "diverged",
                    "position": j, "ref_token": a, "target_token": b, "logprob_diffs": diffs}
        lp_ref = chosen_logprob(ref_top[j], a) if j < len(ref_top) else None
        lp_tgt = chosen_logprob(tgt_top[j], b) if j < len(tgt_top) else None
        if lp_ref is not None and lp_tgt is not None:
            diffs.append(abs(lp_tgt - lp_ref))
    if len(tgt_tokens) < len(ref_tokens):
        return {"compared": len(ref_tokens), "matched": len(tgt_tokens), "outcome": "short",
                "position": len(tgt_tokens), "ref_token": ref_tokens[len(tgt_tokens)], "target_token": None,
                "logprob_diffs": diffs}
    return {"compared": len(ref_tokens), "matched": len(ref_tokens), "outcome": "match", "logprob_diffs": diffs}


def score_e2e(drawn: Sequence[Mapping[str, Any]], answers: Mapping[str, Mapping[str, Any]],
              reference: Mapping[str, Mapping[str, Any]], k: int) -> dict[str, Any]:
    """Every drawn prompt compared with the reference: per-prompt rows, the token match rate over the sample
    (matched / compared), the hard divergences and the logprob differences at matched positions."""
    rows, diffs = [], []
    for item in drawn:
        item_id = str(item["id"])
        row = compare_e2e(reference[item_id], answers[item_id], k)
        diffs += row.pop("logprob_diffs")
        rows.append({"id": item_id, "prompt": str(item.get("prompt", ""))[:60], **row})
    compared = sum(r["compared"] for r in rows)
    matched = sum(r["matched"] for r in rows)
    return {"n": len(rows), "compared": compared, "matched": matched,
            "token_match_rate": matched / compared if compared else None,
            "hard": [r for r in rows if r["outcome"] in ("diverged", "short")],
            "near_ties": sum(r["outcome"] == "near-tie" for r in rows),
            "logprob_diff_max": max(diffs) if diffs else None,
            "logprob_diff_mean": sum(diffs) / len(diffs) if diffs else None, "rows": rows}


# --- eval --------------------------------------------------------------------------------------------------------

def argmax(values: Sequence[float]) -> int:
    """The harness's pick: the first index of the largest value."""
    return max(range(len(values)), key=values.__getitem__)


def excess_probability(choices: Sequence[str], lls: Sequence[float]) -> float | None:
    """Σ exp(log-likelihood) over choices none of which is a prefix of another (exclusive continuations, whose
    probabilities cannot sum past 1); None when some choice is a prefix of another."""
    if any(a != b and b.startswith(a) for a in choices for b in choices) or len(set(choices)) != len(choices):
        return None
    return sum(math.exp(min(0.0, x)) for x in lls)


def _accuracy(correct: Sequence[bool]) -> dict[str, Any]:
    n, hits = len(correct), sum(bool(c) for c in correct)
    low, high = wilson(hits, n)
    return {"n": n, "correct": hits, "accuracy": hits / n if n else None, "wilson_low": low, "wilson_high": high}


def score_mc(drawn: Sequence[Mapping[str, Any]], answers: Mapping[str, Mapping[str, Any]],
             reference: Mapping[str, Mapping[str, Any]], keys: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Accuracy of the argmax of per-choice log-likelihoods, target and reference on the drawn items, their
    agreement, and the items whose choices' probabilities sum past 1 (not log-likelihoods)."""
    target, ref, agree, impossible = [], [], 0, []
    for item in drawn:
        item_id = str(item["id"])
        lls = [float(x) for x in answers[item_id]["loglikelihoods"]]
        pick, ref_pick = argmax(lls), argmax([float(x) for x in reference[item_id]["loglikelihoods"]])
        answer = int(keys[item_id]["answer"])
        target.append(pick == answer)
        ref.append(ref_pick == answer)
        agree += pick == ref_pick
        total = excess_probability([str(c) for c in item.get("choices") or []], lls)
        if total is not None and total > 1 + PROBABILITY_SLACK:
            impossible.append(item_id)
    return {"target": _accuracy(target), "reference": _accuracy(ref),
            "agreement": agree / len(drawn) if drawn else None, "impossible": impossible}


def qa_correct(text: str, until: Sequence[str], answer: str, options: Mapping[str, Any]) -> bool:
    """Exact match as the task scores it: cut at the stop strings, leading space dropped, both normalised."""
    got = eval_tasks.cut_at_stop(text, until).lstrip()
    return eval_tasks._normalise(got, dict(options)) == eval_tasks._normalise(answer, dict(options))


def score_qa(drawn: Sequence[Mapping[str, Any]], answers: Mapping[str, Mapping[str, Any]],
             reference: Mapping[str, Mapping[str, Any]], keys: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    target, ref = [], []
    for item in drawn:
        item_id, until = str(item["id"]), list(item.get("until") or [])
        key = keys[item_id]
        target.append(qa_correct(str(answers[item_id]["text"]), until, key["answer"], key.get("options") or {}))
        ref.append(qa_correct(str(reference[item_id]["text"]), until, key["answer"], key.get("options") or {}))
    return {"target": _accuracy(target), "reference": _accuracy(ref)}


def score_ppl(drawn: Sequence[Mapping[str, Any]], answers: Mapping[str, Mapping[str, Any]],
              reference: Mapping[str, Mapping[str, Any]], keys: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Word perplexity exp(−Σ log-likelihood / Σ words) over the drawn documents, both sides; the documents
    whose token counts differ from the reference's (another tokenization)."""
    words = sum(int(keys[str(i["id"])]["words"]) for i in drawn)
    ll_t = sum(float(answers[str(i["id"])]["loglikelihood"]) for i in drawn)
    ll_r = sum(float(reference[str(i["id"])]["loglikelihood"]) for i in drawn)
    other_tokens = [str(i["id"]) for i in drawn
                    if answers[str(i["id"])].get("tokens") != reference[str(i["id"])].get("tokens")]

    def perplexity(ll: float) -> float | None:
        return math.exp(min(700.0, -ll / words)) if words else None

    return {"n": len(drawn), "words": words, "target": perplexity(ll_t), "reference": perplexity(ll_r),
            "token_counts_differ": other_tokens}


def needle_correct(text: str, value: str) -> bool:
    """Whether the first seven-digit number of the answer is the needle's value (as ``eval_needle`` scores)."""
    match = eval_needle.ANSWER_PATTERN.search(text)
    return match is not None and match.group(0) == value


def needle_by_length(drawn: Sequence[Mapping[str, Any]], answers: Mapping[str, Mapping[str, Any]],
                     keys: Mapping[str, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Accuracy per prompt length on needles whose values the portal made: {length: {n, correct, accuracy,
    wilson_low, wilson_high}}."""
    cells: dict[int, list[bool]] = {}
    for item in drawn:
        item_id = str(item["id"])
        key = keys[item_id]
        cells.setdefault(int(key["length"]), []).append(needle_correct(str(answers[item_id]["text"]),
                                                                       str(key["value"])))
    return {length: _accuracy(correct) for length, correct in sorted(cells.items())}

