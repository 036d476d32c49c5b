"""The ``conformance`` stage: the served OpenAI endpoint (the bundled server the serve stage left up, or an
external engine: only the endpoint is talked to) checked as the model vendors' verifiers check providers, scored
against the reference (``conformance.reference``: transformers, the same template and parsers, greedy, on the
same prompts). One row per check ``{check, passed, detail, target, reference}``
(``contract.conformance``); the verdict recomputes every row from its target and reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agents.pipeline.stages.conformance import probes
from agents.pipeline.stages.conformance.reference import Reference
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.endpoints import chat_template_text
from agents.pipeline.support.engine_process import EngineProcess
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.server import running_server
from contract import thresholds as th
from contract.conformance import declares_tools
from contract.verdicts.conformance import row_failure

# the fixed prompt set: some ask for what a tool answers, some for what none does
PROMPTS: tuple[str, ...] = ("What is the weather in Paris for the next 2 days?", "What time is it in Tokyo?",
                            "Write one sentence about the sea.", "Is it raining in Berlin today?")
PLAIN = [{"role": "user", "content": "Tell me about the moon."}]
MAX_TOKENS = 96  # enough for a call with its arguments
BAD_REQUESTS: dict[str, dict[str, Any]] = {
    "no messages": {"max_tokens": 4},
    "temperature -1": {"messages": PLAIN, "temperature": -1, "max_tokens": 4},
    "max_tokens -5": {"messages": PLAIN, "max_tokens": -5},
    "tool without a function": {"messages": PLAIN, "tools": [{"type": "function"}], "max_tokens": 4},
    "messages not a list": {"messages": "hello", "max_tokens": 4},
}


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _row(check: str, target: Any, reference: Any, detail: str, t: dict[str, float]) -> dict[str, Any]:
    row = {"check": check, "target": target, "reference": reference, "detail": detail}
    why = row_failure(row, t)
    return {"check": check, "passed": why is None, "detail": why or detail, "target": target, "reference": reference}


def _guard(check: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A check whose requests failed is a failed row naming what went wrong, never a crashed stage."""
    try:
        return fn()
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return {"check": check, "passed": False, "detail": f"{type(exc).__name__}: {exc}"[:500], "target": None,
                "reference": None}


class Conformance:
    def __init__(self, ctx: StageContext, endpoint: probes.Endpoint, tools: bool, repeats: int) -> None:
        self.ctx, self.api, self.tools, self.repeats = ctx, endpoint, tools, repeats
        self.t = th.merged(ctx.thresholds)
        self.ref = Reference(ctx)
        self.answers: list[tuple[dict, dict, dict, dict]] = []  # (request, whole choice, whole body, streamed)

    def body(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS,
                **({"tools": probes.TOOLS} if self.tools else {}), **extra}

    def collect(self) -> None:
        """Each prompt ``repeats`` times, whole and streamed, at temperature 0 (tools offered when declared)."""
        for _ in range(self.repeats):
            for prompt in PROMPTS:
                body = self.body(_user(prompt))
                whole = self.api.chat(body)
                self.answers.append((body, whole["choices"][0], whole, self.api.stream(body)))

    def rows(self) -> list[dict[str, Any]]:
        checks: list[tuple[str, Callable[[], dict[str, Any]]]] = []
        if self.tools:
            checks += [("tool_trigger_agreement", self.trigger), ("forced_calls_valid", self.forced)]
        checks += [("json_schema_valid", self.schema), ("stream_equals_whole", self.stream),
                   ("prompt_tokens", self.prompt_tokens), ("stop_honoured", self.stop), ("n_honoured", self.n),
                   ("seed_determinism", self.seed), ("max_tokens_honoured", self.max_tokens),
                   ("error_shape", self.errors)]
        if self.ref.reasoning:
            checks.append(("reasoning_not_in_content", self.reasoning))
        out: list[dict[str, Any]] = []
        for name, fn in checks:
            result = _guard(name, fn)
            out += result if isinstance(result, list) else [result]
        return out

    # --- tools ----------------------------------------------------------------------------------------------

    def trigger(self) -> list[dict[str, Any]]:
        """Trigger agreement, and the validity of the unforced calls' arguments (target and reference)."""
        target, reference = [], []
        counts = {"target": {"valid": 0, "calls": 0}, "reference": {"valid": 0, "calls": 0}}
        for body, choice, _whole, _streamed in self.answers:
            calls, errors = choice["message"].get("tool_calls") or [], probes.tool_errors(choice)
            target.append(bool(calls or errors))
            counts["target"]["calls"] += len(calls) + (1 if errors else 0)
            counts["target"]["valid"] += sum(probes.call_problem(c, probes.TOOLS) is None for c in calls)
            ref = self.ref.answer(body["messages"], body, MAX_TOKENS)
            reference.append(bool(ref["calls"] or ref["errors"]))
            counts["reference"]["calls"] += len(ref["calls"]) + (1 if ref["errors"] else 0)
            counts["reference"]["valid"] += sum(probes.call_problem(c, probes.TOOLS) is None for c in ref["calls"])
        agree = sum(a == b for a, b in zip(target, reference, strict=True))
        return [_row("tool_trigger_agreement", target, reference,
                     f"{agree} of {len(target)} answers call a tool when the reference does", self.t),
                _row("tool_arguments_valid", counts["target"], counts["reference"],
                     f"{counts['target']['valid']} of {counts['target']['calls']} calls valid", self.t)]

    def forced(self) -> dict[str, Any]:
        valid, requests, problems = 0, 0, []
        for prompt in PROMPTS[:2]:
            for choice_arg, name in (("required", None), ({"type": "function", "function": {"name": "get_time"}},
                                                         "get_time")):
                requests += 1
                choice = self.api.chat(self.body(_user(prompt), tool_choice=choice_arg))["choices"][0]
                calls = choice["message"].get("tool_calls") or []
                why = [p for c in calls if (p := probes.call_problem(c, probes.TOOLS, name))] if calls else [
                    f"no call ({'; '.join(probes.tool_errors(choice)) or 'content only'})"]
                valid += not why
                problems += why
        return _row("forced_calls_valid", {"valid": valid, "requests": requests}, {"valid": requests, "requests": requests},
                    f"{valid} of {requests} forced calls valid" + (f": {problems[0][:200]}" if problems else ""), self.t)

    # --- the rest -------------------------------------------------------------------------------------------

    def schema(self) -> dict[str, Any]:
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": probes.ANSWER_SCHEMA, "strict": True}}
        valid, problems = 0, []
        prompts = [*PROMPTS[:2], "Name a city and say one thing about it, as JSON."]
        for prompt in prompts:
            choice = self.api.chat({"messages": _user(prompt), "temperature": 0, "max_tokens": 160,
                                    "response_format": fmt})["choices"][0]
            why = probes.schema_problem(choice["message"].get("content"), probes.ANSWER_SCHEMA)
            valid += why is None
            problems += [why] if why else []
        return _row("json_schema_valid", {"valid": valid, "requests": len(prompts)},
                    {"valid": len(prompts), "requests": len(prompts)},
                    f"{valid} of {len(prompts)} answers valid" + (f": {problems[0][:200]}" if problems else ""), self.t)

    def stream(self) -> dict[str, Any]:
        pairs = [{"whole": probes.normal(c), "streamed": probes.normal(s)} for _b, c, _w, s in self.answers]
        return _row("stream_equals_whole", pairs, None, f"{len(pairs)} answers streamed and not, at temperature 0",
                    self.t)

    def prompt_tokens(self) -> dict[str, Any]:
        target = [w["usage"]["prompt_tokens"] for _b, _c, w, _s in self.answers]
        reference = [len(self.ref.prompt_ids(b["messages"], b.get("tools"))) for b, _c, _w, _s in self.answers]
        return _row("prompt_tokens", target, reference,
                    "usage.prompt_tokens against transformers' apply_chat_template(tools=…)", self.t)

    def stop(self) -> dict[str, Any]:
        free = self.api.chat({"messages": PLAIN, "temperature": 0, "max_tokens": 32})["choices"][0]["message"]
        text = free.get("content") or ""
        if len(text.strip()) < 6:
            raise ValueError(f"the unstopped answer {text!r} is too short to place a stop sequence in")
        at = len(text) // 2
        stop = text[at:at + 3]
        expected = text[:text.find(stop)]
        got = self.api.chat({"messages": PLAIN, "temperature": 0, "max_tokens": 32, "stop": [stop]})
        return _row("stop_honoured", [got["choices"][0]["message"].get("content") or ""], [expected],
                    f"stop {stop!r} in an answer of {len(text)} characters", self.t)

    def n(self) -> dict[str, Any]:
        got = self.api.chat({"messages": PLAIN, "temperature": 1, "seed": 7, "n": 2, "max_tokens": 8})
        return _row("n_honoured", len(got["choices"]), 2, "n=2 at temperature 1", self.t)

    def seed(self) -> dict[str, Any]:
        body = {"messages": PLAIN, "temperature": 1, "top_p": 1, "seed": 1234, "max_tokens": 16}
        texts = [self.api.chat(body)["choices"][0]["message"].get("content") or "" for _ in range(2)]
        return _row("seed_determinism", texts, 1234, "two answers with seed 1234 at temperature 1", self.t)

    def max_tokens(self) -> dict[str, Any]:
        asked = [1, 5]
        got = [self.api.chat({"messages": PLAIN, "temperature": 0, "max_tokens": m, "ignore_eos": True})["usage"][
            "completion_tokens"] for m in asked]
        return _row("max_tokens_honoured", got, asked, "usage.completion_tokens against max_tokens", self.t)

    def errors(self) -> dict[str, Any]:
        target = [{"case": case, **probes.error_shape(self.api.raw(body))} for case, body in BAD_REQUESTS.items()]
        return _row("error_shape", target, {"status": 400, "error_keys": ["message", "type"]},
                    f"{len(target)} malformed requests", self.t)

    def reasoning(self) -> dict[str, Any]:
        leaks = sum(any(m in (c["message"].get("content") or "") for m in ("<think>", "</think>"))
                    for _b, c, _w, _s in self.answers)
        return _row("reasoning_not_in_content", {"leaks": leaks, "responses": len(self.answers)}, {"leaks": 0},
                    "think markers in content", self.t)


def run(ctx: StageContext) -> dict[str, Any]:
    """The conformance section: template_declares_tools, thinking, tool_call_parser, reasoning_parser, repeats,
    prompts, endpoint, checks (rows), passed (every row passed)."""
    if ctx.model_dir is None:
        raise StageFailed("conformance needs the model's tokenizer and weights (the reference): no model directory")
    server = running_server(ctx)
    # an external engine's requests name the model it serves (vLLM and SGLang want it); the bundled server serves one
    endpoint = probes.Endpoint(server.url, server.served_model() if isinstance(server, EngineProcess) else None)
    try:
        tools = declares_tools(chat_template_text(Path(ctx.model_dir)))
        repeats = int(th.merged(ctx.thresholds)["conformance_repeats"])
        conf = Conformance(ctx, endpoint, tools, repeats)
        conf.collect()
    except (httpx.HTTPError, ValueError) as exc:
        raise StageFailed(f"conformance could not question {server.url}: {exc}") from exc
    rows = conf.rows()
    return {"template_declares_tools": tools, "thinking": conf.ref.reasoning is not None,
            "tool_call_parser": conf.ref.parser, "reasoning_parser": conf.ref.reasoning, "repeats": repeats,
            "prompts": len(PROMPTS), "endpoint": server.url, "checks": rows,
            "passed": all(r["passed"] for r in rows),
            "failed_checks": [r["check"] for r in rows if not r["passed"]], "notes": []}

