"""The serving benchmark: streamed OpenAI completions at a sweep of concurrencies (or a Poisson request rate),
plus a long-context case; returns the ``bench`` section of the stage report.

Prompts are token ids of exactly the asked length whenever the vocabulary is known (``bench/vocab.py``), and
every concurrency level gets prompts of its own (seed + level index), as does the warm-up: a server with a
prefix cache (vLLM's) would otherwise serve a level's prompts from the previous level's cache."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agents.runtime.bench.metrics import RequestResult, summarize
from agents.runtime.bench.vocab import resolve_vocab
from contract.expert_balance import expert_balance
from telemetry import tracing

MAX_LEVEL_PROMPTS = 100_000  # a level topped up to its minimum seconds stops here whatever the time
PROBE_SEED = 7919  # the probe's prompts: seeds of their own, never a measured level's


async def _one(client: httpx.AsyncClient, url: str, body: dict) -> RequestResult:
    result = RequestResult()
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                result.error = f"HTTP {resp.status_code}: {text}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message"))
                    return result
                now = time.perf_counter()
                if chunk.get("choices"):  # one chunk per engine step that produced tokens
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    result.output_tokens += 1  # replaced by usage when the server reports it
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
        result.e2e = time.perf_counter() - start
        result.ok = result.ttft > 0.0
        if not result.ok:
            result.error = "no token streamed"
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def image_parts(num: int, seed: int, side: int = 64) -> list[dict[str, Any]]:
    """``num`` chat content parts, each a distinct random ``side`` x ``side`` PNG as a data: URL."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(num):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def request_body(model: str, prompt: Any, max_tokens: int, images: list[dict[str, Any]]) -> tuple[str, dict]:
    """(path, body) of one streamed request: a completion, or with ``images`` a chat message holding them
    before the prompt's text."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                            "stream": True, "stream_options": {"include_usage": True}}
    if not images:
        return "/v1/completions", {**body, "prompt": prompt}
    content = [*images, {"type": "text", "text": prompt}]
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": content}]}


def make_prompts(num: int, input_len: int, vocab_size: int | None, seed: int,
                 exclude: frozenset[int] = frozenset()) -> list[Any]:
    """Token-id prompts of exactly ``input_len`` tokens when the vocabulary is known, else word prompts.
    ``exclude``: ids never drawn (a vision-language model's image placeholder, which needs an image)."""
    rng = random.Random(seed)
    if vocab_size:
        low = min(16, vocab_size // 4)  # stay clear of the special tokens at the bottom of the vocabulary
        allowed = [t for t in range(low, vocab_size) if t not in exclude] if exclude else range(low, vocab_size)
        return [[rng.choice(allowed) for _ in range(input_len)] for _ in range(num)]
    words = ("alpha", "beta", "gamma", "delta", "model", "token", "serve", "cache", "block", "step")
    return [" ".join(rng.choice(words) for _ in range(input_len)) for _ in range(num)]


async def _run(
    client: httpx.AsyncClient,
    base: str,
    prompts: list[Any],
    *,
    model: str,
    output_len: int,
    concurrency: int,
    request_rate: float | None,
    seed: int,
    images: list[dict[str, Any]] = (),  # type: ignore[assignment]
    min_seconds: float = 0.0,
    more: Callable[[int], Any] | None = None,
) -> dict:
    """One level: ``prompts`` at ``concurrency`` (or a Poisson ``request_rate``). With ``min_seconds`` and a
    closed loop, the level goes on with ``more(i)`` (the i-th prompt past the list) until it has run that long,
    as MLPerf's minimum duration (``prompts`` in the summary: how many it issued)."""
    sem = asyncio.Semaphore(concurrency)
    rng = random.Random(seed)

    async def limited(prompt: Any) -> RequestResult:
        async with sem:
            path, body = request_body(model, prompt, output_len, list(images))
            return await _one(client, base + path, body)

    start = time.perf_counter()
    if min_seconds > 0 and more is not None and not request_rate:
        results: list[RequestResult] = []
        issued = itertools.count()

        def next_prompt() -> Any:
            i = next(issued)
            if i < len(prompts):
                return prompts[i]
            if time.perf_counter() - start >= min_seconds or i >= MAX_LEVEL_PROMPTS:
                return None
            return more(i)

        async def worker() -> None:
            while (prompt := next_prompt()) is not None:
                path, body = request_body(model, prompt, output_len, list(images))
                results.append(await _one(client, base + path, body))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return summarize(results, time.perf_counter() - start, concurrency=concurrency, request_rate=request_rate)
    tasks = []
    for prompt in prompts:
        tasks.append(asyncio.create_task(limited(prompt)))
        if request_rate:
            await asyncio.sleep(rng.expovariate(request_rate))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    return summarize(list(results), duration, concurrency=concurrency, request_rate=request_rate)


async def _peak_memory(client: httpx.AsyncClient, base: str) -> int | None:
    try:
        text = (await client.get(f"{base}/metrics")).text
    except httpx.HTTPError:
        return None
    for name in ("day0:peak_memory_bytes", "process_resident_memory_bytes"):
        match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.MULTILINE)
        if match:
            return int(float(match.group(1)))
    return None


async def _expert_counts(client: httpx.AsyncClient, base: str) -> tuple[list[list[int]], int] | None:
    """(tokens per layer and expert so far, EP size), or None when the server has no routed experts."""
    try:
        resp = await client.get(f"{base}/stats/experts")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    body = resp.json()
    return body["counts"], int(body.get("ep_size") or 1)


def _balance(before: tuple[list[list[int]], int] | None, after: tuple[list[list[int]], int] | None) -> dict | None:
    if before is None or after is None:
        return None
    delta = [[a - b for a, b in zip(la, lb, strict=True)] for la, lb in zip(after[0], before[0], strict=True)]
    return expert_balance(delta, after[1])


async def _comm_timer(client: httpx.AsyncClient, base: str, on: bool) -> dict | None:
    """Start (``on``) or stop the server's collective timer; its totals (None: a server without one)."""
    try:
        resp = await client.post(f"{base}/stats/comm", json={"enabled": on})
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None


async def _measured_run(client: httpx.AsyncClient, base: str, prompts: list[Any], **kwargs: Any) -> dict:
    """One run with the server's counters around it: the communication overhead ratio (time in collectives over
    step time, timed on the serving rank with device synchronisation only for this run) and the expert balance
    of the tokens this run routed."""
    experts_before = await _expert_counts(client, base)
    await _comm_timer(client, base, True)
    run = await _run(client, base, prompts, **kwargs)
    comm = await _comm_timer(client, base, False)
    run["comm_overhead_ratio"] = comm.get("comm_overhead_ratio") if comm else None
    run["comm"] = comm
    run["expert_balance"] = _balance(experts_before, await _expert_counts(client, base))
    return run


async def run_benchmark_async(
    url: str,
    *,
    concurrency: list[int] = (1, 4, 16),  # type: ignore[assignment]
    input_len: int = 128,
    output_len: int = 64,
    num_prompts: int = 32,
    request_rate: float | None = None,
    long_context: bool = True,
    long_input_len: int | None = None,
    seed: int = 0,
    timeout: float = 600.0,
    images_per_request: int = 0,
    api_key: str | None = None,
    tokenizer: str | Path | None = None,
    min_seconds: float = 0.0,
    probe: bool = True,
) -> dict:
    """``images_per_request`` N > 0: every request of the concurrency sweep is a chat message with N images
    (random PNGs) before a word prompt of ``input_len`` words; the long-context case stays text. ``tokenizer``:
    the model's tokenizer directory, for token-id prompts on a server whose model card has no ``vocab_size``
    (vLLM's); level ``i`` of the sweep uses ``seed + i``, the long-context case ``seed + len(concurrency)``.
    ``min_seconds``: each level (and each half of the probe) issues fresh prompts past ``num_prompts`` until it
    has run that long. ``probe``: the highest level once more, its requests alternating between one repeated
    prompt and fresh ones (``probe``: each half's tok/s, see ``_probe``; a server that caches results or
    prefixes shows it); ``requested``: what was asked."""
    base = url.rstrip("/")
    if input_len < 1 or output_len < 1 or num_prompts < 1 or not concurrency or min(concurrency) < 1:
        raise ValueError("input_len, output_len, num_prompts and every concurrency must be >= 1")
    if not 0 <= min_seconds <= 86_400:
        raise ValueError(f"min_seconds must be in [0, 86400], got {min_seconds}")
    if not 0 <= images_per_request <= 64:
        raise ValueError(f"images_per_request must be in [0, 64], got {images_per_request}")
    images = image_parts(images_per_request, seed)
    limits = httpx.Limits(max_connections=max(concurrency) + 4, max_keepalive_connections=max(concurrency) + 4)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # a server started with --api-key
    tracing.inject(headers)  # the job's trace (traceparent) goes on to the server, when there is one
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        listing = await client.get(f"{base}/v1/models")
        if listing.status_code == 401:
            raise ValueError("the server needs an API key (give --api-key or set DAY0_API_KEY)")
        card = listing.json()["data"][0]
        model, max_len = card["id"], card.get("max_model_len")
        vocab = resolve_vocab(card, tokenizer)
        if max_len and input_len + output_len > max_len:
            raise ValueError(f"input_len + output_len = {input_len + output_len} exceeds the model's context {max_len}")
        sweep_vocab = None if images else vocab.size

        def prompts_for(num: int, length: int, level_seed: int, size: int | None = sweep_vocab) -> list[Any]:
            return make_prompts(num, length, size, level_seed, vocab.exclude)

        # the warm-up's prompt is its own (another length, another seed): never a cached prefix of a measured one
        path, body = request_body(model, prompts_for(1, min(input_len, 8), seed - 1)[0], 2, images)
        warm = await _one(client, base + path, body)
        if not warm.ok:
            raise RuntimeError(f"warm-up request failed: {warm.error}")
        experts_before = await _expert_counts(client, base)
        runs = []
        for level, conc in enumerate(concurrency):
            level_seed = seed + level
            run = await _measured_run(
                client,
                base,
                prompts_for(num_prompts, input_len, level_seed),
                model=model,
                output_len=output_len,
                concurrency=conc,
                request_rate=request_rate,
                seed=level_seed,
                images=images,
                min_seconds=min_seconds,
                more=lambda i, s=level_seed: prompts_for(1, input_len, (s + 1) * MAX_LEVEL_PROMPTS + i)[0],
            )
            runs.append({**run, "seed": seed + level})
        probed = None
        if probe:
            kwargs = {"model": model, "output_len": output_len, "concurrency": max(concurrency), "request_rate": None,
                      "seed": seed + PROBE_SEED, "images": images, "min_seconds": min_seconds}
            one = prompts_for(1, input_len, seed + PROBE_SEED)[0]
            fresh_seed = seed + PROBE_SEED + 1
            fresh = prompts_for(num_prompts, input_len, fresh_seed)
            probed = await _probe(client, base, one, fresh, lambda i: prompts_for(
                1, input_len, fresh_seed * MAX_LEVEL_PROMPTS + i)[0], **kwargs)
        long_run = None
        if long_context and max_len:
            long_in = long_input_len or max_len - output_len - 1
            long_in = min(long_in, max_len - output_len - 1)
            if long_in > input_len:
                long_prompts = prompts_for(2, long_in, seed + len(concurrency), vocab.size)
                long_run = await _measured_run(
                    client,
                    base,
                    long_prompts,
                    model=model,
                    output_len=output_len,
                    concurrency=1,
                    request_rate=None,
                    seed=seed,
                )
                long_run["input_len"] = long_in
                long_run["seed"] = seed + len(concurrency)
        peak = await _peak_memory(client, base)
        experts_after = await _expert_counts(client, base)
    expert_load = _balance(experts_before, experts_after)
    return {
        "endpoint": base,
        "model": model,
        "input_len": input_len,
        "output_len": output_len,
        "num_prompts": num_prompts,
        "request_rate": request_rate,
        "images_per_request": images_per_request,
        "prompts": {**vocab.describe(), **({"kind": "words"} if images else {})},  # the sweep's; long is text
        "requested": {"concurrency": list(concurrency), "num_prompts": num_prompts, "input_len": input_len,
                      "output_len": output_len, "ignore_eos": True, "min_seconds": min_seconds,
                      "request_rate": request_rate},
        "runs": runs,
        "probe": probed,
        "long_context": long_run,
        "peak_memory_bytes": peak,
        "expert_load": expert_load,
    }


async def _probe(client: httpx.AsyncClient, base: str, one: Any, fresh: list[Any], more: Callable[[int], Any], *,
                 model: str, output_len: int, concurrency: int, images: list[dict[str, Any]] = (),  # type: ignore[assignment]
                 min_seconds: float = 0.0, **_: Any) -> dict:
    """The repeated-prompt probe: one closed-loop run at ``concurrency`` whose requests alternate between the one
    repeated prompt and fresh ones (``fresh``, then ``more(i)`` until ``min_seconds``), so both halves share the
    same seconds of the server and of the host (a busy host slows both alike). Each half's ``output_tok_s`` is
    its output tokens over its requests' summed end-to-end seconds, times the concurrency: the rate a request
    slot gives that half. A cache of results or prefixes answers the repeated requests sooner."""
    halves: dict[str, list[RequestResult]] = {"repeated": [], "fresh": []}
    order = itertools.count()
    start = time.perf_counter()

    def next_prompt() -> tuple[str, Any] | None:
        i = next(order)
        if i >= 2 * len(fresh) and (time.perf_counter() - start >= min_seconds or i >= MAX_LEVEL_PROMPTS):
            return None
        if i % 2 == 0:
            return "repeated", one
        k = i // 2
        return "fresh", fresh[k] if k < len(fresh) else more(k)

    async def worker() -> None:
        while (item := next_prompt()) is not None:
            path, body = request_body(model, item[1], output_len, list(images))
            halves[item[0]].append(await _one(client, base + path, body))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out: dict[str, Any] = {"concurrency": concurrency, "interleaved": True}
    for half, results in halves.items():
        busy = sum(r.e2e for r in results if r.ok) / concurrency
        out[half] = _probe_summary(summarize(results, busy, concurrency=concurrency))
    return out


def _probe_summary(run: dict) -> dict:
    keys = ("prompts", "completed", "failed", "duration_s", "output_tokens", "output_tok_s", "req_s")
    return {**{k: run.get(k) for k in keys}, "ttft_ms_p50": run["ttft_ms"]["p50"], "tpot_ms_p50": run["tpot_ms"]["p50"]}


def run_benchmark(url: str, **kwargs: Any) -> dict:
    """Blocking wrapper of ``run_benchmark_async`` (the ``bench`` section of the stage report). Callable from a
    thread that already runs an event loop (a notebook, a Playwright session): the benchmark then gets its own
    loop on a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_benchmark_async(url, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="day0-bench") as pool:
        return pool.submit(asyncio.run, run_benchmark_async(url, **kwargs)).result()
