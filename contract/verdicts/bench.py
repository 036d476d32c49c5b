"""The bench stage's verdict: each run's numbers against each other, against what the job asked, and against
physics. Pure: no Django, no torch (the model's bytes come from the torch-free planner modules).

What a run must show (each limit a key of ``thresholds``):

* its latencies: p50 ≤ p90 ≤ p99, none negative, TPOT and TTFT no longer than end to end;
* physics: TPOT p50 no lower than ``bench_tpot_floor_factor`` × the time the hardware's memory bandwidth needs
  to read what one decode step must read per device (the active weights at the run's dtype over the tensor-
  and expert-parallel degrees, the LM head, and the KV cache of one prompt); output tok/s no more than
  concurrency × 1000 / TPOT; Little's law: req/s × mean end-to-end (the mean number in flight) no more than
  the concurrency;
* its counts: completed + failed equal to the prompts asked, req/s × duration = completed, tok/s × duration =
  output tokens, on ignore-EOS runs output tokens per request within ``bench_output_len_tolerance`` of the
  asked length; the levels run equal to the levels asked;
* its length: at least ``bench_min_requests`` requests and ``bench_min_seconds`` seconds, and the samples
  behind its percentiles (a p99 of fewer than ``bench_p99_min_samples`` samples is noted as the maximum);
* a repeated-prompt probe (one prompt sent over and over) no more than ``bench_repeat_max_speedup`` × faster
  than fresh prompts at the same level: a cache of results or prefixes is not the runtime's speed."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from contract.verdicts.base import LATENCY_METRICS, PERCENTILES, Context, Verdict
from contract.verdicts.base import number as _number
from contract.verdicts.base import text as _text

ASKED_KEYS = ("concurrency", "num_prompts", "input_len", "output_len", "ignore_eos", "min_seconds")
COUNT_SLACK = 0.05  # rounded rates times a rounded duration: within 5 % (and one request or token) of the count


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decode_floor_bytes(config: Mapping[str, Any], dtype: str | None, tp: int, ep: int, context_tokens: int) -> int:
    """Bytes one decode step must read on the busiest device, at least: every layer's tensor-parallel share of
    its attention and dense weights, its replicated weights, the active experts' share over ``max(tp, ep)``
    devices, the LM head's vocabulary-parallel share, and the KV cache of one sequence of ``context_tokens``
    over ``tp``. Pipeline stages run one after another for a token, so ``pp`` does not divide it. A ValueError
    (or the spec's own error) when the config or dtype cannot be read."""
    from contract.model.params import count_params
    from contract.model.spec import parse_config
    from contract.planner.memory import kv_bytes_per_token, layer_bits, resolve_dtype, rest_bits

    config = dict(config)
    name, keep_attention = resolve_dtype(dtype or "auto", config)
    spec = parse_config(config)
    counts = count_params(spec)
    bits = 0.0
    for layer, n in counts.kind_counts():
        sharded, replicated, experts = layer_bits(layer, name, keep_attention)
        active = experts * layer.top_k * layer.expert_size / layer.experts if layer.experts else 0.0
        bits += n * (sharded / tp + replicated + active / max(tp, ep))
    bits += (counts.lm_head or counts.embedding) * rest_bits(name) / tp  # a tied head reads the embedding
    return int(bits / 8 + kv_bytes_per_token(spec, name) * context_tokens / tp)


def _ordered(levels: set[Any]) -> list[Any]:
    """Levels in numeric order (anything that is not a number after, as text)."""
    return sorted(levels, key=lambda c: (0, c, "") if _number(c) is not None else (1, 0, str(c)))


def _asked(v: Verdict, s: Mapping[str, Any], ctx: Context) -> dict[str, Any]:
    """What the bench was asked to run: the job's ``spec.bench`` where it says, else the section's own
    ``requested`` block; a section that contradicts the job fails."""
    job = ctx.bench_asked if isinstance(ctx.bench_asked, Mapping) else {}
    stated = s.get("requested") if isinstance(s.get("requested"), Mapping) else {}
    asked: dict[str, Any] = {}
    for key in ASKED_KEYS:
        own, wanted = stated.get(key), job.get(key)
        if key == "concurrency" and isinstance(wanted, str):
            wanted = [int(c) for c in wanted.split(",") if c.strip()]
        if wanted is not None:
            if own is not None and own != wanted:
                v.fail(f"requested {key} {_text(own)} differs from the job's {_text(wanted)}")
            asked[key] = wanted
        elif own is not None:
            asked[key] = own
    if not isinstance(asked.get("concurrency"), list) or _int(asked.get("num_prompts")) is None:
        v.missing("requested missing (the concurrency levels and prompts per level the bench was asked to run)")
    return asked


def _floor(v: Verdict, s: Mapping[str, Any], ctx: Context, asked: Mapping[str, Any]) -> tuple[float, str] | None:
    """(the TPOT floor in ms, how it was computed), or None with a note saying why it was not checked."""
    hw = ctx.hardware
    bandwidth = _number(hw.memory_bandwidth_gbps) if hw is not None else None
    if bandwidth is None or bandwidth <= 0:
        if hw is not None and hw.owned:
            v.missing("the hardware states no memory bandwidth, so the TPOT floor cannot be checked (its owner "
                      "sets memory_bandwidth_gbps)")
        else:
            v.note("TPOT floor not checked: the hardware states no memory bandwidth")
        return None
    if not ctx.model.config:
        v.note("TPOT floor not checked: the model's config is not known")
        return None
    layout = ctx.layout or {}
    tp, ep = _int(layout.get("tp")), _int(layout.get("ep"))
    if not tp or not ep or tp < 1 or ep < 1:  # unknown: the widest layout of one node, the lowest floor
        tp = ep = max(1, hw.devices_per_node)
        v.note(f"TPOT floor: the layout is not known, assumed tp=ep={tp} (the lowest floor on one node)")
    context = _int(asked.get("input_len")) or _int(s.get("input_len")) or 1
    try:
        floor_bytes = decode_floor_bytes(ctx.model.config, ctx.dtype, tp, ep, max(1, context))
    except Exception as exc:  # a config the planner cannot read: say so, never pass silently
        v.note(f"TPOT floor not checked: the planner cannot read the config ({type(exc).__name__}: {exc})")
        return None
    floor_ms = floor_bytes / (bandwidth * 1e9) * 1000.0
    how = (f"{floor_bytes} bytes per decode step per device (tp={tp}, ep={ep}, {context} tokens of KV) over "
           f"{_text(bandwidth)} GB/s")
    return floor_ms, how


def _latencies(v: Verdict, run: Mapping[str, Any], where: str) -> dict[str, dict[str, float | None]]:
    stats: dict[str, dict[str, float | None]] = {}
    for metric in LATENCY_METRICS:
        block = run.get(metric)
        if not isinstance(block, Mapping):
            v.missing(f"{where}: {metric} missing")
            continue
        stats[metric] = {p: _number(block.get(p)) for p in ("mean", *PERCENTILES)}
        if any(stats[metric][p] is None for p in PERCENTILES):
            v.missing(f"{where}: {metric} percentiles p50/p90/p99 missing")
            continue
        p50, p90, p99 = (stats[metric][p] for p in PERCENTILES)
        if min(p50, p90, p99) < 0 or (stats[metric]["mean"] or 0) < 0:
            v.fail(f"{where}: {metric} has a negative value")
        if not p50 <= p90 <= p99:
            v.fail(f"{where}: {metric} percentiles are not ordered (p50 {_text(p50)}, p90 {_text(p90)}, "
                   f"p99 {_text(p99)})")
    e2e = stats.get("e2e_ms", {})
    for name, label in (("tpot_ms", "TPOT"), ("ttft_ms", "TTFT")):
        own = stats.get(name, {})
        for p in ("mean", *PERCENTILES):  # each request's is within its end to end, so each statistic is too
            if own.get(p) is not None and e2e.get(p) is not None and own[p] > e2e[p]:
                v.fail(f"{where}: {label} {p} {_text(own[p])} ms exceeds end-to-end {p} {_text(e2e[p])} ms")
                break
    return stats


def _counts(v: Verdict, run: Mapping[str, Any], where: str, t: Mapping[str, float], asked: Mapping[str, Any],
            completed: int, failed: int) -> None:
    issued = completed + failed
    stated = _int(run.get("prompts"))
    if stated is not None and stated != issued:
        v.fail(f"{where}: completed + failed = {issued}, the run says it issued {stated}")
    wanted = _int(asked.get("num_prompts"))
    topped_up = (_number(asked.get("min_seconds")) or 0) > 0  # a level may run on past its prompts to its seconds
    if wanted is not None and (issued < wanted or (issued > wanted and not topped_up)):
        v.fail(f"{where}: completed + failed = {issued}, the level was asked {wanted} prompts")
    if issued < t["bench_min_requests"]:
        v.fail(f"{where}: {issued} requests, a baseline level needs at least {int(t['bench_min_requests'])}")
    duration = _number(run.get("duration_s"))
    if duration is None or duration <= 0:
        v.missing(f"{where}: duration_s missing")
        return
    if duration < t["bench_min_seconds"]:
        v.fail(f"{where}: ran {_text(duration)} s, a baseline level runs at least {_text(t['bench_min_seconds'])} s")
    for rate_key, count_key, unit in (("req_s", None, "requests"), ("output_tok_s", "output_tokens", "tokens")):
        rate = _number(run.get(rate_key))
        count = completed if count_key is None else _int(run.get(count_key))
        if rate is None or count is None:
            continue
        if abs(rate * duration - count) > max(1.0, COUNT_SLACK * count):
            v.fail(f"{where}: {rate_key} {_text(rate)} × duration {_text(duration)} s is not the "
                   f"{count} {unit} it completed")
    output_len, tokens = _int(asked.get("output_len")), _int(run.get("output_tokens"))
    if asked.get("ignore_eos") is True and output_len and completed:
        if tokens is None:
            v.missing(f"{where}: output_tokens missing (an ignore-EOS run's lengths cannot be checked)")
        elif abs(tokens / completed - output_len) > t["bench_output_len_tolerance"] * output_len:
            v.fail(f"{where}: {tokens / completed:.1f} output tokens per request on an ignore-EOS run asked "
                   f"{output_len} (more than {t['bench_output_len_tolerance']:.0%} apart)")


def _physics(v: Verdict, run: Mapping[str, Any], where: str, t: Mapping[str, float], conc: int,
             stats: Mapping[str, Mapping[str, float | None]], floor: tuple[float, str] | None) -> None:
    tpot, e2e = stats.get("tpot_ms", {}), stats.get("e2e_ms", {})
    tok_s, req_s = _number(run.get("output_tok_s")), _number(run.get("req_s"))
    fastest = min((x for x in (tpot.get("mean"), tpot.get("p50")) if x is not None), default=None)
    if floor is not None and tpot.get("p50") is not None:
        floor_ms, how = floor
        if tpot["p50"] < floor_ms * t["bench_tpot_floor_factor"]:
            v.fail(f"{where}: TPOT p50 {_text(tpot['p50'])} ms is below the physical floor {floor_ms:.4g} ms "
                   f"({how}) × {_text(t['bench_tpot_floor_factor'])}")
    if tok_s is not None and fastest is not None and fastest > 0:
        bound = conc * 1000.0 / fastest
        if tok_s > bound * (1 + t["bench_rate_tolerance"]):
            v.fail(f"{where}: output {_text(tok_s)} tok/s is above concurrency {conc} × 1000 / TPOT "
                   f"{_text(fastest)} ms = {bound:.4g} tok/s (+{t['bench_rate_tolerance']:.0%})")
    elif tok_s is not None and fastest is not None and fastest <= 0 and tok_s > 0:
        v.fail(f"{where}: TPOT {_text(fastest)} ms cannot produce {_text(tok_s)} tok/s")
    if req_s is not None and e2e.get("mean") is not None:
        in_flight = req_s * e2e["mean"] / 1000.0
        if in_flight > conc * (1 + t["bench_littles_law_tolerance"]):
            v.fail(f"{where}: Little's law: req/s {_text(req_s)} × mean end-to-end {_text(e2e['mean'])} ms = "
                   f"{in_flight:.3g} requests in flight, above the concurrency {conc} "
                   f"(+{t['bench_littles_law_tolerance']:.0%})")


def _samples(v: Verdict, run: Mapping[str, Any], where: str, t: Mapping[str, float], completed: int) -> None:
    samples = run.get("samples")
    if not isinstance(samples, Mapping) or any(_int(samples.get(m)) is None for m in ("ttft_ms", "e2e_ms")):
        v.missing(f"{where}: samples missing (the count of requests behind each percentile)")
        return
    for metric in ("ttft_ms", "e2e_ms"):
        if samples[metric] != completed:
            v.fail(f"{where}: {metric} over {samples[metric]} samples, the run completed {completed} requests")
    least = min((n for m in LATENCY_METRICS if (n := _int(samples.get(m))) is not None and n > 0), default=0)
    if 0 < least < t["bench_p99_min_samples"]:
        v.note(f"{where}: p99 of {least} samples (fewer than {int(t['bench_p99_min_samples'])}) is the maximum")


def _probe(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float]) -> None:
    probe = s.get("probe")
    if not isinstance(probe, Mapping):
        v.missing("probe missing (a level run with fresh prompts and again with one repeated prompt)")
        return
    fresh = _number((probe.get("fresh") or {}).get("output_tok_s")) if isinstance(probe.get("fresh"), Mapping) \
        else None
    repeated = _number((probe.get("repeated") or {}).get("output_tok_s")) \
        if isinstance(probe.get("repeated"), Mapping) else None
    if fresh is None or repeated is None or fresh <= 0:
        v.missing("probe: fresh and repeated output_tok_s missing")
        return
    # the sweep's run at the probe's level is fresh prompts too: load on a shared host only slows a run, and a
    # cache speeds only the repeated prompt, so the faster fresh measurement is the one to compare with
    level = next((r for r in s.get("runs") or () if isinstance(r, Mapping)
                  and r.get("concurrency") == probe.get("concurrency")), None)
    sweep = _number(level.get("output_tok_s")) if level is not None else None
    if sweep is not None and sweep > fresh:
        fresh = sweep
    limit = t["bench_repeat_max_speedup"]
    if repeated > fresh * limit:
        v.fail(f"repeated-prompt probe at concurrency {probe.get('concurrency')}: {_text(repeated)} tok/s is "
               f"{repeated / fresh:.2f}× the fresh prompts' {_text(fresh)} (at most {_text(limit)}×): a cache "
               "answers, not the runtime")


def _bench(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    runs = s.get("runs")
    if not isinstance(runs, list) or not runs:
        v.missing("runs missing")
        return
    asked = _asked(v, s, ctx)
    floor = _floor(v, s, ctx, asked)
    levels = set()
    for i, run in enumerate(runs):
        if not isinstance(run, Mapping):
            v.missing(f"run {i} is not an object")
            continue
        c = run.get("concurrency")
        where = f"run at concurrency {c}"
        levels.add(c)
        conc = _int(c)
        if conc is None or conc < 1:
            v.missing(f"{where}: concurrency must be an integer of at least 1")
            continue
        stats = _latencies(v, run, where)
        tok_s = _number(run.get("output_tok_s"))
        if tok_s is None:
            v.missing(f"{where}: output_tok_s missing")
        elif tok_s <= 0:
            v.fail(f"{where} produced no output tokens")
        failed, completed = _int(run.get("failed")), _int(run.get("completed"))
        if failed is None or failed < 0:
            v.missing(f"{where}: failed (the count of failed requests) missing")
            continue
        limit = t["bench_max_failure_ratio"]
        total = failed + completed if completed is not None else None
        if failed and (total is None or failed / total > limit):
            ratio = f" of {total}" if total else ""
            v.fail(f"{where} has {failed}{ratio} failed requests" + (f" (above {limit:g})" if limit else ""))
        if completed is None or completed < 0:
            v.missing(f"{where}: completed (the count of completed requests) missing")
            continue
        _physics(v, run, where, t, conc, stats, floor)
        _counts(v, run, where, t, asked, completed, failed)
        _samples(v, run, where, t, completed)
    wanted = int(t["bench_min_concurrency_levels"])
    if len(levels) < wanted:
        v.fail(f"{len(levels)} concurrency level(s), a baseline sweeps at least {wanted}")
    asked_levels = asked.get("concurrency")
    if isinstance(asked_levels, list) and all(isinstance(c, Hashable) for c in asked_levels) \
            and set(asked_levels) != levels:
        missing, extra = _ordered(set(asked_levels) - levels), _ordered(levels - set(asked_levels))
        v.fail(f"the levels run {_ordered(levels)} are not the levels asked {asked_levels}"
               + (f" (missing {missing})" if missing else "") + (f" (not asked {extra})" if extra else ""))
    _probe(v, s, t)
