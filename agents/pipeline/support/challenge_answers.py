"""What an agent runs for the portal's reference pool and challenges (docs/references.md): the items' checks, their
token ids, and each kind's raw outputs from one model backend: ``lm_backends.ReferenceLM`` (the ``reference``
stage, transformers fp32) or ``lm_backends.ServedLM`` (the ``eval`` stage's served target). The e2e answers of
the target come from the runtime itself (``stages/align/e2e.py``: ``target_greedy_top``).

Both sides build the same token ids from the same item: mc pairs by the harness's context/continuation split
(``eval_tasks.encode_pair``, each choice as given: it carries its delimiter, " Paris"), qa prompts and needle
prompts without special tokens (as the eval stage encodes them), perplexity in disjoint windows of
``ppl_window`` tokens after the BOS (else EOS) token, e2e prompts as the align stage encodes them (the
tokenizer's own special tokens, or the chat template with one user message when ``chat``). A needle item whose
prompt cannot be built in its length, or does not fit the context, is answered ``{"id", "text": "", "error"}``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.models import encode, tokenizer
from contract.suites import agent_env
from contract.suites import needle as eval_needle
from contract.suites import tasks as eval_tasks

KINDS: tuple[str, ...] = ("e2e", "mc", "qa", "ppl", "needle", "code", "agent")
EVAL_KINDS: tuple[str, ...] = ("mc", "qa", "ppl", "needle")
ACTING_KINDS: tuple[str, ...] = ("code", "agent")  # answered by ``challenge_acting``
MAX_TURNS = agent_env.MAX_TURNS  # the environment's turns (an item may not ask for others)
MAX_ITEMS = 10_000  # per kind
MAX_TEXT = 200_000  # characters of one prompt, context or document
MAX_NEW_TOKENS = 1024
MAX_CHOICES = 32
MAX_UNTIL = 8
MAX_DISTRACTORS = 32
DEFAULT_TOP_K = 5
MAX_TOP_K = 20  # what the served endpoint gives (``logprobs`` 0..20)
NEEDLE_MAX_TOKENS = eval_needle.MAX_TOKENS
NEEDLE_UNTIL = ("\n",)
PPL_MAX_WINDOW = 2048


def _bad(path: str, why: str) -> StageFailed:
    return StageFailed(f"{path}: {why}")


def _text(item: Mapping[str, Any], key: str, path: str, *, limit: int = MAX_TEXT) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise _bad(f"{path}.{key}", f"must be a non-empty string of at most {limit} characters, got "
                                    f"{type(value).__name__}{f' of {len(value)}' if isinstance(value, str) else ''}")
    return value


def _int(item: Mapping[str, Any], key: str, path: str, low: int, high: int) -> int:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"{path}.{key}", f"must be an integer in [{low}, {high}], got {value!r}")
    return value


def _strings(item: Mapping[str, Any], key: str, path: str, low: int, high: int, limit: int) -> list[str]:
    value = item.get(key, [] if low == 0 else None)
    if (not isinstance(value, list) or not low <= len(value) <= high
            or not all(isinstance(v, str) and v and len(v) <= limit for v in value)):
        raise _bad(f"{path}.{key}", f"must be a list of {low} to {high} non-empty strings of at most {limit} "
                                    f"characters")
    return list(value)


def _item(kind: str, raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _bad(path, f"must be an object, got {type(raw).__name__}")
    item: dict[str, Any] = {"id": _text(raw, "id", path, limit=128)}
    if kind == "e2e":
        chat = raw.get("chat", False)
        if not isinstance(chat, bool):
            raise _bad(f"{path}.chat", f"must be true or false, got {chat!r}")
        item.update(prompt=_text(raw, "prompt", path), chat=chat,
                    max_tokens=_int(raw, "max_tokens", path, 1, MAX_NEW_TOKENS))
    elif kind == "mc":
        item.update(context=_text(raw, "context", path), choices=_strings(raw, "choices", path, 2, MAX_CHOICES, 4096))
    elif kind == "qa":
        item.update(prompt=_text(raw, "prompt", path), until=_strings(raw, "until", path, 0, MAX_UNTIL, 64),
                    max_tokens=_int(raw, "max_tokens", path, 1, MAX_NEW_TOKENS))
    elif kind == "ppl":
        item.update(text=_text(raw, "text", path))
    elif kind == "code":
        item.update(task_id=_text(raw, "task_id", path, limit=64), prompt=_text(raw, "prompt", path),
                    stop=_strings(raw, "stop", path, 0, MAX_UNTIL, 64),
                    max_tokens=_int(raw, "max_tokens", path, 1, MAX_NEW_TOKENS))
    elif kind == "agent":
        item.update(seed=_int(raw, "seed", path, 0, 2**31 - 1), max_turns=_int(raw, "max_turns", path, MAX_TURNS, MAX_TURNS),
                    max_tokens=_int(raw, "max_tokens", path, 1, MAX_NEW_TOKENS))
    else:  # needle
        distractors = raw.get("distractors", [])
        if not isinstance(distractors, list) or len(distractors) > MAX_DISTRACTORS:
            raise _bad(f"{path}.distractors", f"must be a list of at most {MAX_DISTRACTORS} {{key, value}} objects")
        pairs = []
        for i, d in enumerate(distractors):
            at = f"{path}.distractors[{i}]"
            if not isinstance(d, Mapping):
                raise _bad(at, f"must be an object {{key, value}}, got {type(d).__name__}")
            pairs.append((_text(d, "key", at, limit=200), _text(d, "value", at, limit=64)))
        item.update(length=_int(raw, "length", path, 16, 1 << 20), depth=_int(raw, "depth", path, 0, 100),
                    key=_text(raw, "key", path, limit=200), value=_text(raw, "value", path, limit=64),
                    distractors=pairs)
    return item


def parse_items(doc: Mapping[str, Any], where: str, kinds: Sequence[str] = KINDS) -> dict[str, list[dict[str, Any]]]:
    """Checked copies of the items of ``kinds`` in ``doc`` (a challenge or a reference pool; an absent kind has
    none); a bad one is a StageFailed naming its path (``challenge.mc[3].choices``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in kinds:
        raw = doc.get(kind)
        if raw is None:
            out[kind] = []
            continue
        if not isinstance(raw, list) or len(raw) > MAX_ITEMS:
            raise _bad(f"{where}.{kind}", f"must be a list of at most {MAX_ITEMS} items")
        items = [_item(kind, r, f"{where}.{kind}[{i}]") for i, r in enumerate(raw)]
        ids = [item["id"] for item in items]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise _bad(f"{where}.{kind}", f"item id {dup!r} appears more than once")
        out[kind] = items
    return out


def top_k_of(doc: Mapping[str, Any], where: str) -> int:
    """The ``top_k`` of a challenge or pool (default 5, at most what the endpoint gives)."""
    if doc.get("top_k") is None:
        return DEFAULT_TOP_K
    return _int(doc, "top_k", where, 1, MAX_TOP_K)


def nonce_of(doc: Mapping[str, Any], where: str, fallback: str | None) -> str | None:
    """The nonce a challenge carries (else the job's), echoed in the raw outputs."""
    value = doc.get("nonce", fallback)
    if value is not None and (not isinstance(value, str) or len(value) > 128):
        raise _bad(f"{where}.nonce", "must be a string of at most 128 characters")
    return value


def context_length(ctx: StageContext) -> int:
    config = ctx.config or {}
    return int(config.get("max_position_embeddings") or (config.get("text_config") or {}).get(
        "max_position_embeddings") or 2048)


def ppl_window(ctx: StageContext) -> int:
    """Tokens per perplexity window, the same on both sides: the model's context up to 2048, less the prefix."""
    return min(context_length(ctx), PPL_MAX_WINDOW) - 1


def encoder(tok: Any) -> Callable[[str], list[int]]:
    return lambda text: list(tok(text, add_special_tokens=False)["input_ids"])


def prefix_token(tok: Any) -> int:
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if prefix is None:
        raise StageFailed("perplexity needs a prefix token, and the tokenizer has neither BOS nor EOS")
    return int(prefix)


def e2e_prompts(ctx: StageContext, items: Sequence[Mapping[str, Any]]) -> tuple[list[list[int]], list[int]]:
    """Each e2e item's prompt ids (``models.encode``: chat items through the chat template) and its
    ``max_tokens`` clipped to the context left after the prompt."""
    if tokenizer(ctx) is None:
        raise StageFailed("the e2e items need the model's tokenizer, and the checkpoint has none")
    prompts, _ = encode(ctx, [item["prompt"] for item in items], chat=tuple(item["chat"] for item in items))
    room = context_length(ctx)
    limits = []
    for item, prompt in zip(items, prompts, strict=True):
        if len(prompt) >= room:
            raise StageFailed(f"e2e item {item['id']}: its prompt is {len(prompt)} tokens, the context {room}")
        limits.append(min(item["max_tokens"], room - len(prompt)))
    return prompts, limits


def _step(ctx: StageContext, what: str) -> Callable[[int, int], None]:
    return lambda done, total: ctx.progress(done, total, what)


def answer_mc(lm: Any, tok: Any, items: Sequence[Mapping[str, Any]], ctx: StageContext, label: str
              ) -> list[dict[str, Any]]:
    encode = encoder(tok)
    requests, owners = [], []
    for n, item in enumerate(items):
        for choice in item["choices"]:
            requests.append(eval_tasks.encode_pair(encode, item["context"], choice))
            owners.append(n)
    scored = lm.loglikelihood_greedy(requests, _step(ctx, f"{label} mc"), ctx.check_cancelled)
    out = [{"id": item["id"], "loglikelihoods": [], "greedy": []} for item in items]
    for owner, (ll, greedy) in zip(owners, scored, strict=True):
        out[owner]["loglikelihoods"].append(ll)
        out[owner]["greedy"].append(greedy)
    return out


def answer_qa(lm: Any, tok: Any, items: Sequence[Mapping[str, Any]], ctx: StageContext, label: str
              ) -> list[dict[str, Any]]:
    encode = encoder(tok)
    groups: dict[tuple[int, tuple[str, ...]], list[int]] = {}  # one generate call per (max_tokens, until)
    for n, item in enumerate(items):
        groups.setdefault((item["max_tokens"], tuple(item["until"])), []).append(n)
    texts: list[str] = [""] * len(items)
    for (max_tokens, until), members in groups.items():
        generated = lm.generate([encode(items[n]["prompt"]) for n in members], max_tokens, list(until),
                                _step(ctx, f"{label} qa"), ctx.check_cancelled)
        for n, text in zip(members, generated, strict=True):
            texts[n] = text
    return [{"id": item["id"], "text": text} for item, text in zip(items, texts, strict=True)]


def answer_ppl(lm: Any, tok: Any, items: Sequence[Mapping[str, Any]], ctx: StageContext, label: str,
               window: int) -> list[dict[str, Any]]:
    encode, prefix = encoder(tok), prefix_token(tok)
    requests, owners, counts = [], [], []
    for n, item in enumerate(items):
        ids = encode(item["text"])
        counts.append(len(ids))
        for start in range(0, len(ids), window):  # disjoint windows, each after the token before it
            requests.append(([prefix if start == 0 else ids[start - 1]], ids[start : start + window]))
            owners.append(n)
    lls = lm.loglikelihood(requests, _step(ctx, f"{label} ppl"), ctx.check_cancelled)
    totals = [0.0] * len(items)
    for owner, ll in zip(owners, lls, strict=True):
        totals[owner] += ll
    return [{"id": item["id"], "loglikelihood": total, "tokens": count}
            for item, total, count in zip(items, totals, counts, strict=True)]


def needle_prompt(tok: Any, item: Mapping[str, Any]) -> list[int]:
    """The needle item's prompt ids: ``eval_needle`` with the item's key, value and distractors at its length
    and depth (the filler drawn from the item's id). ValueError when the length is too short."""
    encode = encoder(tok)
    built = eval_needle.build_item(lambda text: len(encode(text)), item["length"], item["depth"], seed=item["id"],
                                   needle=(item["key"], item["value"], item["distractors"]))
    return encode(built.prompt)


def answer_needle(lm: Any, tok: Any, items: Sequence[Mapping[str, Any]], ctx: StageContext, label: str,
                  context: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"id": item["id"]} for item in items]
    prompts, members = [], []
    for n, item in enumerate(items):
        if item["length"] + NEEDLE_MAX_TOKENS > context:
            out[n].update(text="", error=f"length {item['length']} plus the answer's {NEEDLE_MAX_TOKENS} tokens "
                                         f"does not fit the context of {context}")
            continue
        try:
            prompt = needle_prompt(tok, item)
        except ValueError as exc:
            out[n].update(text="", error=str(exc))
            continue
        out[n]["prompt_tokens"] = len(prompt)
        prompts.append(prompt)
        members.append(n)
    if prompts:
        texts = lm.generate(prompts, NEEDLE_MAX_TOKENS, list(NEEDLE_UNTIL), _step(ctx, f"{label} needle"),
                            ctx.check_cancelled)
        for n, text in zip(members, texts, strict=True):
            out[n]["text"] = text
    return out


def answer_eval(lm: Any, tok: Any, items: Mapping[str, Sequence[Mapping[str, Any]]], ctx: StageContext, label: str,
                *, context: int, window: int) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """The raw outputs of every eval kind that has items, and the seconds each took."""
    raw: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    for kind in EVAL_KINDS:
        if not items.get(kind):
            continue
        t0 = time.perf_counter()
        ctx.emit("log", f"{label}: {len(items[kind])} {kind} items")
        if kind == "mc":
            raw[kind] = answer_mc(lm, tok, items[kind], ctx, label)
        elif kind == "qa":
            raw[kind] = answer_qa(lm, tok, items[kind], ctx, label)
        elif kind == "ppl":
            raw[kind] = answer_ppl(lm, tok, items[kind], ctx, label, window)
        else:
            raw[kind] = answer_needle(lm, tok, items[kind], ctx, label, context)
        seconds[kind] = round(time.perf_counter() - t0, 3)
    return raw, seconds
