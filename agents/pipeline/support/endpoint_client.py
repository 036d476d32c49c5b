"""Token ids and top-k logprobs through an OpenAI-compatible ``/v1/completions``: what endpoint align
(``stages/align/endpoint.py``, ``kv_self.py``) asks an external engine. Prompts go as token ids (chat prompts
rendered with the model's template here, so both sides see exactly the same ids), answers come back with
``return_tokens_as_token_ids`` (vLLM's extension, also the bundled server's: logprobs name tokens
``token_id:N``), so no token is guessed back from its text. Each request names the served ``model``."""

from __future__ import annotations

from typing import Any

import httpx

from agents.pipeline.support.lm_backends import ServedError, top_entries
from telemetry import tracing

ID_PREFIX = "token_id:"


def token_id(name: Any, url: str) -> int:
    """``token_id:N`` as N; a ServedError saying the engine ignored ``return_tokens_as_token_ids`` otherwise."""
    if isinstance(name, str) and name.startswith(ID_PREFIX) and name[len(ID_PREFIX):].lstrip("-").isdigit():
        return int(name[len(ID_PREFIX):])
    raise ServedError(f"{url}: a logprobs token {str(name)[:40]!r} is not 'token_id:N' (the engine ignored "
                      "return_tokens_as_token_ids; endpoint align needs token ids, not texts)")


def _lp(value: Any, url: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ServedError(f"{url}: a logprob {value!r} is not a number")
    return float(value)


class EndpointClient:
    """One engine's ``/v1/completions`` for token-exact greedy decodes and prefills."""

    def __init__(self, url: str, model: str | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.client = httpx.Client(base_url=self.url, timeout=timeout, headers=tracing.inject())

    def close(self) -> None:
        self.client.close()

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        body = {**({"model": self.model} if self.model else {}), **body, "return_tokens_as_token_ids": True}
        try:
            r = self.client.post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise ServedError(f"{self.url}/v1/completions: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise ServedError(f"{self.url}/v1/completions answered HTTP {r.status_code}: {r.text[:300]}")
        try:
            return r.json()
        except ValueError as exc:
            raise ServedError(f"{self.url}/v1/completions answered no JSON: {exc}") from exc

    def _logprobs(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            choice = body["choices"][0]
            block = choice["logprobs"]
            if not isinstance(block, dict):
                raise TypeError("logprobs is not an object")
        except (KeyError, IndexError, TypeError) as exc:
            raise ServedError(f"{self.url}: a completion without choices[0].logprobs ({exc!r})") from None
        return choice, block

    def positions(self, block: dict[str, Any]) -> list[list[dict[str, Any]] | None]:
        """Each position of a legacy logprobs block as ``top_entries`` (chosen token first); None where the
        engine gives no logprob (the first prompt token)."""
        tokens, values = block.get("tokens") or [], block.get("token_logprobs") or []
        tops = block.get("top_logprobs") or [None] * len(tokens)
        if not (len(tokens) == len(values) == len(tops)):
            raise ServedError(f"{self.url}: logprobs lists of different lengths ({len(tokens)} tokens, "
                              f"{len(values)} logprobs, {len(tops)} top lists)")
        out: list[list[dict[str, Any]] | None] = []
        for name, value, top in zip(tokens, values, tops, strict=True):
            if value is None:
                out.append(None)
                continue
            pairs = sorted(((token_id(k, self.url), _lp(v, self.url)) for k, v in (top or {}).items()),
                           key=lambda kv: -kv[1])
            out.append(top_entries(token_id(name, self.url), _lp(value, self.url), pairs))
        return out

    def greedy(self, prompt: list[int], max_tokens: int, top_k: int) -> dict[str, Any]:
        """The greedy continuation of ``prompt`` (temperature 0, ending at the engine's end-of-sequence or
        ``max_tokens``): ``{"tokens", "top_logprobs", "prompt_tokens", "cached_tokens"}`` (the reference's e2e
        shape; ``cached_tokens`` when the engine reports prefix-cache hits in its usage, else None)."""
        body = self.post({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": top_k})
        _, block = self._logprobs(body)
        positions = self.positions(block)
        if any(p is None for p in positions):
            raise ServedError(f"{self.url}: a generated token without its logprob")
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
        cached = details.get("cached_tokens")
        return {"tokens": [p[0]["token"] for p in positions if p], "top_logprobs": positions,
                "prompt_tokens": len(prompt), "cached_tokens": cached if isinstance(cached, int) else None}

    def prefill(self, ids: list[int], top_k: int) -> list[list[dict[str, Any]] | None]:
        """The top-k logprobs of every position of ``ids`` prefilled (``echo``; one token is drawn and dropped,
        since not every engine takes ``max_tokens`` 0): position i's list predicts ``ids[i]``; position 0 None."""
        body = self.post({"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": top_k, "echo": True})
        _, block = self._logprobs(body)
        positions = self.positions(block)
        if len(positions) < len(ids):
            raise ServedError(f"{self.url}: echo returned {len(positions)} positions for a prompt of {len(ids)} "
                              "tokens")
        got = [p[0]["token"] if p else None for p in positions[1:len(ids)]]
        if got != ids[1:]:
            raise ServedError(f"{self.url}: echo returned other prompt tokens than were sent")
        return positions[:len(ids)]
