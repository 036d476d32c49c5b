"""The two sides of the eval stage, answering the same token-id requests:

* ``ReferenceLM``: ``transformers`` in fp32 on CPU (the model ``support.models.reference_model`` loads);
* ``ServedLM``: the target as it is served, through the OpenAI-compatible ``/v1/completions`` of the server the
  serve stage started: log-likelihoods from ``echo`` + ``logprobs`` (the prompt's own token logprobs),
  generations from greedy ``max_tokens`` with ``stop``. Prompts go as token ids, so both sides see the same
  tokens.

``loglikelihood_greedy`` also says, per request, whether the continuation is the model's greedy one (every
continuation token is the argmax at its position: lm-eval's ``is_greedy``); ``ReferenceLM.greedy_top`` is the
greedy continuation with the top-k logprobs of every position (the ``reference`` stage's e2e answers).

Both take a ``progress(done, total)`` callback and a ``check()`` called between units of work (cancellation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import torch

from contract.suites.tasks import cut_at_stop
from telemetry import tracing

Progress = Callable[[int, int], None]

MAX_STOP = 4  # stop strings an OpenAI-compatible server takes in one request (vLLM refuses more)


def _noop(*_: Any) -> None:
    return None


class ReferenceLM:
    """transformers fp32 on CPU."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, token_budget: int = 1024) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.token_budget = token_budget  # tokens per right-padded log-likelihood batch

    def loglikelihood(self, requests: Sequence[tuple[list[int], list[int]]], progress: Progress = _noop,
                      check: Callable[[], None] = _noop) -> list[float]:
        """Σ log p(continuation | context) per request, in batches of similar length."""
        return [ll for ll, _ in self.loglikelihood_greedy(requests, progress, check)]

    @torch.inference_mode()
    def loglikelihood_greedy(self, requests: Sequence[tuple[list[int], list[int]]], progress: Progress = _noop,
                             check: Callable[[], None] = _noop) -> list[tuple[float, bool]]:
        """(Σ log p(continuation | context), whether the continuation is the greedy one) per request."""
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][0]) - len(requests[i][1]))
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        done = 0
        while done < len(order):
            longest = len(requests[order[done]][0]) + len(requests[order[done]][1])
            batch = order[done : done + max(1, self.token_budget // longest)]
            seqs = [requests[i][0] + requests[i][1] for i in batch]
            ids = torch.zeros(len(seqs), longest, dtype=torch.long)  # [B, L]
            mask = torch.zeros(len(seqs), longest, dtype=torch.long)  # [B, L]
            for row, seq in enumerate(seqs):
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # [B, L, V]
            for row, i in enumerate(batch):
                context, continuation = requests[i]
                start = len(context)
                logprobs = torch.log_softmax(logits[row, start - 1 : start - 1 + len(continuation)].double(), -1)
                targets = torch.tensor(continuation, dtype=torch.long)  # [C]
                out[i] = (float(logprobs.gather(1, targets[:, None]).sum()), bool((logprobs.argmax(-1) == targets).all()))
            done += len(batch)
            progress(done, len(order))
            check()
        return out

    @torch.inference_mode()
    def generate(self, prompts: Sequence[list[int]], max_tokens: int, until: Sequence[str],
                 progress: Progress = _noop, check: Callable[[], None] = _noop) -> list[str]:
        """Greedy continuations, one prompt at a time (no padding), cut at the first ``until`` string."""
        from transformers import StoppingCriteriaList

        out = []
        for n, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], dtype=torch.long)
            stop = StoppingCriteriaList([_StopOnText(self.tokenizer, len(prompt), until)]) if until else None
            generated = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                            do_sample=False, temperature=None, top_p=None, top_k=None,
                                            stopping_criteria=stop)
            text = self.tokenizer.decode(generated[0, len(prompt) :].tolist(), skip_special_tokens=True)
            out.append(cut_at_stop(text, until))
            progress(n + 1, len(prompts))
            check()
        return out


    @torch.inference_mode()
    def greedy_top(self, prompts: Sequence[list[int]], max_tokens: Sequence[int], top_k: int,
                   eos: set[int] | frozenset[int] = frozenset(), progress: Progress = _noop,
                   check: Callable[[], None] = _noop) -> list[dict[str, Any]]:
        """Per prompt the greedy continuation (argmax of the fp32 logits, the KV cache between steps, ending
        after an end-of-sequence token or ``max_tokens[i]`` tokens): ``{"tokens", "top_logprobs",
        "prompt_tokens"}`` with ``top_logprobs`` as ``top_entries`` gives them."""
        out = []
        for n, (prompt, limit) in enumerate(zip(prompts, max_tokens, strict=True)):
            res = self.model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=True)
            tokens: list[int] = []
            tops: list[list[dict[str, Any]]] = []
            for _ in range(limit):
                logits = res.logits[0, -1]  # [V]
                token = int(logits.argmax())
                logprobs = torch.log_softmax(logits.double(), dim=-1)  # [V]
                values, ids = logprobs.topk(min(top_k, logprobs.shape[-1]))
                tokens.append(token)
                tops.append(top_entries(token, float(logprobs[token]), zip(ids.tolist(), values.tolist(), strict=True)))
                if token in eos or len(tokens) == limit:
                    break
                res = self.model(input_ids=torch.tensor([[token]], dtype=torch.long), use_cache=True, **cache_of(res))
            out.append({"tokens": tokens, "top_logprobs": tops, "prompt_tokens": len(prompt)})
            progress(n + 1, len(prompts))
            check()
        return out


def cache_of(out: Any) -> dict[str, Any]:
    """The KV cache of a forward's output as the next forward takes it (``cache`` in transformers 5.2x, the
    deprecated ``past_key_values`` before)."""
    if "cache" in getattr(out, "__dataclass_fields__", {}):
        return {"cache": out.cache}
    return {"past_key_values": out.past_key_values}


def top_entries(token: int, logprob: float, top: Any) -> list[dict[str, Any]]:
    """One position's ``top_logprobs`` (docs/references.md): the chosen token first, then the other top-k
    ``(token id, logprob)`` pairs best first; logprobs rounded to 6 decimals."""
    entries = [{"token": int(token), "logprob": round(float(logprob), 6)}]
    entries += [{"token": int(t), "logprob": round(float(v), 6)} for t, v in top if int(t) != int(token)]
    return entries


class _StopOnText:
    """Stop a single-sequence ``generate`` once the decoded new tokens contain a stop string (the server's
    ``stop``); cheap for short answers, unlike building transformers' stop-string tables over the vocabulary."""

    def __init__(self, tokenizer: Any, prompt_len: int, until: Sequence[str]) -> None:
        self.tokenizer, self.prompt_len, self.until = tokenizer, prompt_len, list(until)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        text = self.tokenizer.decode(input_ids[0, self.prompt_len :].tolist(), skip_special_tokens=True)
        done = any(stop in text for stop in self.until)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class ServedError(RuntimeError):
    """The served endpoint refused a request or answered something unusable (the message says which)."""


class ServedLM:
    """The served target through ``/v1/completions``; ``concurrency`` requests in flight (the server batches)."""

    def __init__(self, url: str, *, concurrency: int = 4, batch: int = 16, timeout: float = 600.0,
                 model: str | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.model = model  # the served model id each request names (an external engine's; vLLM wants it)
        self.concurrency = concurrency
        self.batch = batch  # log-likelihood prompts per request
        self.client = httpx.Client(base_url=self.url, timeout=timeout, headers=tracing.inject())  # the job's trace

    def close(self) -> None:
        self.client.close()

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        if self.model:
            body = {"model": self.model, **body}
        try:
            r = self.client.post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise ServedError(f"{self.url}/v1/completions: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise ServedError(f"{self.url}/v1/completions answered HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any], progress: Progress,
             check: Callable[[], None]) -> list[Any]:
        out: list[Any] = [None] * len(items)
        pool = ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            for done, future in enumerate(as_completed(futures), start=1):
                out[futures[future]] = future.result()
                progress(done, len(items))
                check()
        finally:  # an error or a cancellation: the requests not yet sent are dropped
            pool.shutdown(wait=True, cancel_futures=True)
        return out

    def _loglikelihood_batch(self, batch: Sequence[tuple[list[int], list[int]]],
                             greedy: bool = False) -> list[tuple[float, bool | None]]:
        """One request for the batch: prefill only (``max_tokens`` 0), the prompts' own logprobs echoed (with
        ``greedy``, each position's best alternative too: the continuation is greedy when every one of its tokens
        is as likely as the best)."""
        body = self._post({"prompt": [c + x for c, x in batch], "max_tokens": 0, "temperature": 0, "echo": True,
                           "logprobs": 1 if greedy else 0})
        try:
            rows = {int(c["index"]): c["logprobs"] for c in body["choices"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise ServedError(f"{self.url}: an echo+logprobs completion without choices[].logprobs "
                              f"({exc!r})") from None
        out: list[tuple[float, bool | None]] = []
        for i, (context, continuation) in enumerate(batch):
            block = rows.get(i) or {}
            logprobs = (block.get("token_logprobs") or []) if isinstance(block, dict) else []
            span = slice(len(context), len(context) + len(continuation))
            wanted = logprobs[span]
            if len(wanted) != len(continuation) or any(not isinstance(v, int | float) for v in wanted):
                raise ServedError(f"{self.url}: echo returned {len(logprobs)} token logprobs for prompt {i} of "
                                  f"{len(context) + len(continuation)} tokens")
            is_greedy = None
            if greedy:
                tops = (block.get("top_logprobs") or [])[span]
                if len(tops) != len(continuation) or not all(isinstance(t, dict) and t for t in tops):
                    raise ServedError(f"{self.url}: echo returned no top_logprobs for the continuation of prompt {i}")
                is_greedy = all(v >= max(t.values()) for v, t in zip(wanted, tops, strict=True))
            out.append((float(sum(wanted)), is_greedy))
        return out

    def loglikelihood(self, requests: Sequence[tuple[list[int], list[int]]], progress: Progress = _noop,
                      check: Callable[[], None] = _noop) -> list[float]:
        """Σ log p(continuation | context) per request, from the echoed prompt logprobs, ``batch`` prompts per
        HTTP request."""
        return [ll for ll, _ in self._loglikelihoods(requests, False, progress, check)]

    def loglikelihood_greedy(self, requests: Sequence[tuple[list[int], list[int]]], progress: Progress = _noop,
                             check: Callable[[], None] = _noop) -> list[tuple[float, bool]]:
        """(Σ log p(continuation | context), whether the continuation is the greedy one) per request."""
        return [(ll, bool(g)) for ll, g in self._loglikelihoods(requests, True, progress, check)]

    def _loglikelihoods(self, requests: Sequence[tuple[list[int], list[int]]], greedy: bool, progress: Progress,
                        check: Callable[[], None]) -> list[tuple[float, bool | None]]:
        batches = [requests[i : i + self.batch] for i in range(0, len(requests), self.batch)]

        def batch_progress(done: int, _total: int) -> None:  # in requests, not batches
            progress(min(done * self.batch, len(requests)), len(requests))

        results = self._map(lambda b: self._loglikelihood_batch(b, greedy), batches, batch_progress, check)
        return [row for batch in results for row in batch]

    def generate(self, prompts: Sequence[list[int]], max_tokens: int, until: Sequence[str],
                 progress: Progress = _noop, check: Callable[[], None] = _noop) -> list[str]:
        """Greedy continuations (temperature 0) stopping at ``until``: the server is sent its first ``MAX_STOP``
        (the OpenAI API's limit, which vLLM enforces with a 400), and every one of them cuts the text here."""

        def one(prompt: list[int]) -> str:
            body = self._post({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                               **({"stop": list(until)[:MAX_STOP]} if until else {})})
            try:
                return cut_at_stop(str(body["choices"][0]["text"]), until)
            except (KeyError, IndexError, TypeError) as exc:
                raise ServedError(f"{self.url}: a completion without choices[0].text ({exc!r})") from None

        return self._map(one, prompts, progress, check)

