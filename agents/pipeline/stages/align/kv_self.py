"""The KV-cache self-consistency check through an endpoint (no internals; as SGLang checks its cache): the
top-k logprobs of a decoded continuation against those of the same text prefilled again, on a prefix-cache
*miss* (prompt A first) and a *hit* (A again after a different prompt B), and the two decodes against each
other; mean top-k KL (``contract.endpoint_align.topk_kl``) under ``kv_self_max_mean_kl``. Two controls prove the
check works: the *no-op* (the miss decode compared with itself: ~0, the arithmetic invents no difference) and a
*perturbed* prompt (A's last token replaced, the same continuation prefilled: its KL must stand above a floor and
ten times the miss case's, so the check is shown to see a difference; an engine whose logprobs ignore the
prompt passes nothing). The portal recomputes every KL from the rows."""

from __future__ import annotations

from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.endpoint_client import EndpointClient
from agents.pipeline.support.models import encode
from contract.endpoint_align import (
    AGREEING_CASES,
    NOOP_CASE,
    NOOP_MAX_KL,
    PERTURBED_CASE,
    chosen_tokens,
    perturbed_floor,
    row_kl,
)

NEW_TOKENS = 16
# two different long prompts: several KV blocks each, so an engine's prefix cache can hit on A's repeat
TEXT_A = ("The lighthouse keeper kept a log of every ship that passed the point: its name, its flag, the hour, "
          "the weather and the colour of the sea. In winter the entries grew short, a line or two between storms; "
          "in summer they filled whole pages with gulls, fishing boats and the ferry that crossed twice a day. "
          "When the keeper retired, the log ran to forty volumes, and the harbour museum put the first one on "
          "display beside a brass telescope and a map of the coast. Visitors always asked the same question:")
TEXT_B = ("A recipe for bread needs only four things: flour, water, salt and yeast. The baker weighs them, mixes "
          "them into a rough dough, and leaves it to rest for half an hour before the first fold. Each fold "
          "stretches the gluten and traps a little more air; after four folds the dough is smooth and springy. "
          "It rises slowly in a cool room overnight, is shaped in the morning, and bakes in a hot oven with steam "
          "for the first ten minutes. The crust should crackle as it cools, and the crumb")


def _row(case: str, prompt: str, decoded: list[Any], prefilled: list[Any], **extra: Any) -> dict[str, Any]:
    kl = row_kl(decoded, prefilled)
    mean, peak = kl if kl is not None else (None, None)
    a, b = chosen_tokens(decoded), [max(p, key=lambda e: e["logprob"])["token"] if p else None for p in prefilled]
    return {"case": case, "prompt": prompt, "positions": len(decoded), "decoded": decoded, "prefilled": prefilled,
            "mean_kl": mean, "max_kl": peak, "token_mismatches": sum(x != y for x, y in zip(a, b, strict=False)),
            **extra}


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Positions of two decodes whose distributions are comparable: up to and including the first divergence."""
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    return n if first is None else first + 1


def run(ctx: StageContext, client: EndpointClient, thresholds: dict[str, float]) -> dict[str, Any]:
    """The ``kv_self`` block: top_k, bound, new_tokens, rows (miss, hit, hit_vs_miss, noop, perturbed), passed."""
    k = int(thresholds.get("kv_self_top_k", 5))
    bound = float(thresholds["kv_self_max_mean_kl"])
    (a, b), _ = encode(ctx, [TEXT_A, TEXT_B])
    miss = client.greedy(a, NEW_TOKENS, k)  # A on a cold cache
    ctx.check_cancelled()
    client.greedy(b, NEW_TOKENS, k)  # a different prompt between
    hit = client.greedy(a, NEW_TOKENS, k)  # A again: a prefix-cache hit where the engine caches prefixes
    ctx.check_cancelled()
    pre_miss = client.prefill(a + miss["tokens"], k)[len(a):]
    pre_hit = pre_miss if hit["tokens"] == miss["tokens"] else client.prefill(a + hit["tokens"], k)[len(a):]
    perturbed = list(a)
    perturbed[-1] = next(t for t in b[::-1] if t != a[-1])  # the token before the continuation, replaced
    pre_perturbed = client.prefill(perturbed + miss["tokens"], k)[len(perturbed):]
    common = _common_prefix(miss["tokens"], hit["tokens"])
    rows = [
        _row("miss", "A", miss["top_logprobs"], pre_miss, cached_tokens=miss["cached_tokens"]),
        _row("hit", "A", hit["top_logprobs"], pre_hit, cached_tokens=hit["cached_tokens"]),
        _row("hit_vs_miss", "A", hit["top_logprobs"][:common], miss["top_logprobs"][:common]),
        _row(NOOP_CASE, "A", miss["top_logprobs"], miss["top_logprobs"]),
        _row(PERTURBED_CASE, "A with its last token replaced", miss["top_logprobs"], pre_perturbed,
             replaced_position=len(a) - 1),
    ]
    problems = []
    floor = perturbed_floor(rows[0]["mean_kl"])  # the miss row
    for row in rows:
        mean = row["mean_kl"]
        if mean is None:
            problems.append(f"{row['case']}: malformed logprobs")
        elif row["case"] in AGREEING_CASES and mean > bound:
            problems.append(f"{row['case']}: mean top-{k} KL {mean:.3g} is above {bound:g}")
        elif row["case"] == NOOP_CASE and mean > NOOP_MAX_KL:
            problems.append(f"no-op control: mean KL {mean:.3g} of a run against itself is not ~0")
        elif row["case"] == PERTURBED_CASE and mean <= floor:
            problems.append(f"perturbed prompt: mean KL {mean:.3g} is not above {floor:.3g} (the check cannot see "
                            "a difference)")
    hits = hit["cached_tokens"]
    return {"top_k": k, "bound": bound, "perturbed_floor": floor, "new_tokens": NEW_TOKENS, "prompt_tokens": [len(a), len(b)],
            "prefix_cache_reported": hits is not None, "rows": rows, "problems": problems, "passed": not problems,
            "method": "decoded top-k logprobs vs the same tokens prefilled (echo), KL(decoded || prefilled) over the "
                      "decoded side's top-k, renormalised"}
