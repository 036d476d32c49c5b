"""The align end-to-end part and the eval verdict as the portal judges them: from its own scores of an agent's
raw outputs against the reference it holds (``scoring``), never from the agent's numbers, which stay
claims. The portal builds a ``ChallengeJudge`` per job attempt and passes it in the verdict ``Context``; the
verdicts call it for those two parts and it keeps what it scored in ``scores`` (stored with the result).

Pure: standard library only (no torch, no Django)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.challenges import acting
from contract.challenges import scoring as cs
from contract.verdicts.base import Verdict

EVAL_KINDS: tuple[str, ...] = ("mc", "qa", "ppl", "needle", "code", "agent")


@dataclass
class ChallengeJudge:
    """One attempt's challenge (as sent: ``nonce``, ``top_k``, items per kind), the portal-only keys (answers by
    kind and id), the release's finished reference outputs (None: ``awaiting`` says why) and the sample sizes;
    ``scores`` collects per stage what was scored."""

    challenge: Mapping[str, Any] | None
    keys: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    reference: Mapping[str, Any] | None = None
    awaiting: str = "awaiting reference: the release has no finished reference run"
    sizes: Mapping[str, Any] = field(default_factory=dict)
    reruns: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # code id -> the portal's own run
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __call__(self, v: Verdict, stage: str, section: Mapping[str, Any], t: Mapping[str, float]) -> None:
        if stage == "align":
            self.align_e2e(v, section, t)
        elif stage == "eval":
            self.eval(v, section, t)

    # --- shared -----------------------------------------------------------------------------------------------

    def _raw_checked(self, v: Verdict, part: str, raw: Any, kinds: tuple[str, ...]
                     ) -> dict[str, dict[str, Mapping[str, Any]]] | None:
        """The raw answers of ``kinds`` by id, or None after naming why they cannot be scored (incomplete)."""
        drawn = {kind: list((self.challenge or {}).get(kind) or []) for kind in kinds}
        if self.challenge is None or not any(drawn.values()):
            v.missing(f"{_at(part)}no challenge was drawn for this attempt (the portal draws one at each dispatch)")
            return None
        if not isinstance(raw, Mapping):
            v.missing(f"{_at(part)}raw outputs missing (the answers to the attempt's challenge)")
            return None
        if raw.get("nonce") != self.challenge.get("nonce"):
            v.missing(f"{_at(part)}the raw outputs answer another challenge (their nonce is not this attempt's)")
            return None
        out, ok = {}, True
        top_k = int(self.challenge.get("top_k") or 5)
        for kind in kinds:
            if not drawn[kind]:
                continue
            answers = raw.get("items") if part == "e2e" else raw.get(kind)
            by_id, problems = cs.check_raw(kind, answers, drawn[kind], top_k)
            for problem in problems:
                v.missing(problem)  # names its kind
            ok = ok and not problems
            out[kind] = by_id
        return out if ok else None

    def _reference(self, v: Verdict, part: str, kinds: tuple[str, ...]) -> bool:
        if self.reference is None:
            v.missing(f"{_at(part)}{self.awaiting}")
            return False
        for kind in kinds:
            missing = [str(i["id"]) for i in (self.challenge or {}).get(kind) or []
                       if kind != "needle" and str(i["id"]) not in (self.reference.get(kind) or {})]
            if missing:
                v.missing(f"{_at(part)}the reference has no {kind} output for {cs._listed(missing)} (another pool "
                          "version); awaiting its reference run")
                return False
        return True

    # --- align: end to end ------------------------------------------------------------------------------------

    def align_e2e(self, v: Verdict, section: Mapping[str, Any], t: Mapping[str, float]) -> None:
        e2e = section.get("e2e")
        raw = e2e.get("raw") if isinstance(e2e, Mapping) else None
        answers = self._raw_checked(v, "e2e", raw, ("e2e",))
        if answers is None or not self._reference(v, "e2e", ("e2e",)):
            return
        k = int(t["e2e_top_k"])
        drawn = list(self.challenge["e2e"])
        score = cs.score_e2e(drawn, answers["e2e"], self.reference["e2e"], k)
        minimum = float(t["align_min_token_match"])
        # the reference's own tokens never leave the portal: reasons and stored scores name the target's only
        for row in score["rows"]:
            row.pop("ref_token", None)
        self.scores["align"] = {"e2e": {**score, "top_k": k, "min_token_match_rate": minimum}}
        for row in score["hard"][:3]:
            if row["outcome"] == "short":
                v.fail(f"e2e prompt {row['id']} ({row['prompt']!r}): the target stopped after {row['position']} "
                       "tokens, the reference did not")
            else:
                v.fail(f"e2e prompt {row['id']} ({row['prompt']!r}) position {row['position']}: target token "
                       f"{row['target_token']} and the reference's differ beyond a near-tie (not within each "
                       f"other's top-{k})")
        if len(score["hard"]) > 3:
            v.fail(f"e2e: {len(score['hard'])} prompts diverge beyond a near-tie")
        rate = score["token_match_rate"]
        if rate is None:
            v.missing("e2e: no token was compared (the reference generated none)")
        elif rate < minimum:
            v.fail(f"e2e token match rate {rate:.4f} ({score['matched']} of {score['compared']} tokens) is below "
                   f"{minimum:g}")
        v.note(f"e2e scored by the portal: {score['n']} prompts, match rate "
               f"{'n/a' if rate is None else f'{rate:.4f}'}, {score['near_ties']} near-tie(s), logprob diff max "
               f"{_fmt(score['logprob_diff_max'])} mean {_fmt(score['logprob_diff_mean'])}")

    # --- eval --------------------------------------------------------------------------------------------------

    def eval(self, v: Verdict, section: Mapping[str, Any], t: Mapping[str, float]) -> None:
        answers = self._raw_checked(v, "eval", section.get("raw"), EVAL_KINDS)
        if answers is None or not self._reference(v, "eval", EVAL_KINDS):
            return
        rtol = float(t["eval_rtol"])
        ref, keys, scores = self.reference, self.keys, {"rtol": rtol, "sizes": dict(self.sizes)}
        drawn = {kind: list(self.challenge.get(kind) or []) for kind in EVAL_KINDS}
        if drawn["mc"]:
            mc = scores["mc"] = cs.score_mc(drawn["mc"], answers["mc"], ref["mc"], keys.get("mc") or {})
            if mc["impossible"]:
                v.fail(f"mc: the choices' probabilities of {len(mc['impossible'])} item(s) "
                       f"({cs._listed(mc['impossible'])}) sum past 1: these are not log-likelihoods")
            self._accuracy_rule(v, "mc accuracy", mc, rtol)
        if drawn["qa"]:
            qa = scores["qa"] = cs.score_qa(drawn["qa"], answers["qa"], ref["qa"], keys.get("qa") or {})
            self._accuracy_rule(v, "qa exact match", qa, rtol)
        if drawn["ppl"]:
            ppl = scores["ppl"] = cs.score_ppl(drawn["ppl"], answers["ppl"], ref["ppl"], keys.get("ppl") or {})
            target, reference = ppl["target"], ppl["reference"]
            if target is None or reference is None:
                v.missing("ppl: no words to score")
            elif target > reference * (1 + rtol):
                v.fail(f"ppl word perplexity {target:.4g} is above the reference's {reference:.4g} × (1 + {rtol:g})")
            elif target < reference * (1 - rtol):
                v.fail(f"ppl word perplexity {target:.4g} is below the reference's {reference:.4g} × (1 − {rtol:g}): "
                       "the same weights cannot be this much better")
            if ppl["token_counts_differ"]:
                v.note(f"eval: ppl token counts differ from the reference's for {cs._listed(ppl['token_counts_differ'])}")
        if drawn["needle"]:
            self._needle(v, drawn["needle"], answers["needle"], rtol, scores)
        if drawn["code"]:
            self._code(v, drawn["code"], answers["code"], t, scores)
        if drawn["agent"]:
            self._agent(v, drawn["agent"], answers["agent"], t, scores)
        self.scores["eval"] = scores

    def _accuracy_rule(self, v: Verdict, label: str, score: Mapping[str, Any], rtol: float) -> None:
        target, ref = score["target"], score["reference"]
        if target["accuracy"] is None:
            v.missing(f"{label}: no item scored")
            return
        if target["accuracy"] < ref["accuracy"] * (1 - rtol):
            v.fail(f"{label} {target['accuracy']:.4f} ({target['correct']}/{target['n']}, Wilson 95 % "
                   f"[{target['wilson_low']:.3f}, {target['wilson_high']:.3f}]) is below the reference's "
                   f"{ref['accuracy']:.4f} × (1 − {rtol:g})")

    def _needle(self, v: Verdict, drawn: list, answers: Mapping[str, Mapping[str, Any]], rtol: float,
                scores: dict[str, Any]) -> None:
        per_length = cs.needle_by_length(drawn, answers, self.keys.get("needle") or {})
        ref_needle = self.reference.get("needle_accuracy") or {}
        rows = []
        for length, target in per_length.items():
            ref = ref_needle.get(str(length))
            if not isinstance(ref, Mapping) or cs._num(ref.get("accuracy")) is None:
                v.missing(f"needle: the reference has no accuracy at length {length}")
                continue
            rows.append({"length": length, "target": target, "reference": dict(ref)})
            # fresh needles on each side: a drop counts when even the target's upper Wilson bound is short of it
            if target["wilson_high"] < ref["accuracy"] * (1 - rtol):
                v.fail(f"needle at length {length}: accuracy {target['accuracy']:.3f} ({target['correct']}/"
                       f"{target['n']}, Wilson 95 % upper {target['wilson_high']:.3f}) is below the reference's "
                       f"{ref['accuracy']:.3f} × (1 − {rtol:g})")
        scores["needle"] = rows


    def _code(self, v: Verdict, drawn: list, answers: Mapping[str, Mapping[str, Any]], t: Mapping[str, float],
              scores: dict[str, Any]) -> None:
        code = scores["code"] = {**acting.score_code(drawn, answers, self.reference["code"], self.reruns),
                                 "tolerance": float(t["eval_code_pass_tol"])}
        for item_id in code["disputes"][:5]:
            row = next(r for r in code["rows"] if r["id"] == item_id)
            who = ("the reference run ran the identical completion (same sha256)" if row["same_completion"]
                   else "the portal re-ran that completion (same sha256)")
            v.fail(f"code {item_id}: the target's completion is claimed to {'pass' if row['claimed'] else 'fail'}, "
                   f"but {who} and it {'fails' if row['claimed'] else 'passes'}: a disputed item fails")
        if len(code["disputes"]) > 5:
            v.fail(f"code: {len(code['disputes'])} disputed items")
        ref, tgt = code["pass_at_1"]["reference"], code["pass_at_1"]["target"]
        if tgt + 1e-9 < ref - code["tolerance"]:
            v.fail(f"code humaneval pass@1 {tgt:.3g} ({code['n']} problems) is below the reference's {ref:.3g} − "
                   f"{code['tolerance']:g}")
        if code["agents_word"]:
            v.note(f"code: {len(code['agents_word'])} of {code['n']} completions differ from the reference's; "
                   "their pass/fail is the agent's sandbox's until the portal's worker re-runs them")

    def _agent(self, v: Verdict, drawn: list, answers: Mapping[str, Mapping[str, Any]], t: Mapping[str, float],
               scores: dict[str, Any]) -> None:
        agent = scores["agent"] = {**acting.score_agent(drawn, answers, self.reference["agent"]),
                                   "tolerance": float(t["eval_agent_success_tol"]),
                                   "min_turn_agreement": float(t["eval_agent_min_turn_agreement"])}
        if agent["false_claims"]:
            v.note(f"agent: success claimed for {cs._listed(agent['false_claims'])}, which the portal's replay of "
                   "the actions does not reach (success is the replay's)")
        ref, tgt = agent["success"]["reference"], agent["success"]["target"]
        if tgt + 1e-9 < ref - agent["tolerance"]:
            v.fail(f"agent_kv success {tgt:.3g} ({agent['n']} episodes, replayed by the portal) is below the "
                   f"reference's {ref:.3g} − {agent['tolerance']:g}")
        if agent["turn_agreement"] + 1e-9 < agent["min_turn_agreement"]:
            v.fail(f"agent_kv turn agreement {agent['turn_agreement']:.3g} is below {agent['min_turn_agreement']:g}")


def _at(part: str) -> str:
    """The part's prefix inside its stage's reasons ("e2e: " in align; none for eval, the stage itself)."""
    return "" if part == "eval" else f"{part}: "


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
