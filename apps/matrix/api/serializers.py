"""The response schema of ``/api/v1/cells/{model}/{hardware}/`` (documentation only: the view builds plain data).

The keys that pass a stored section through unchanged are documented as any JSON value (``JSONField``); the keys
the runtime-evidence selector computes carry their types."""

from __future__ import annotations

from rest_framework import serializers

from apps.jobs.api.serializers import JobSerializer

ANY = serializers.JSONField


def _nullable_float(help_text: str) -> serializers.FloatField:
    return serializers.FloatField(allow_null=True, help_text=help_text)


class CompileRowSerializer(serializers.Serializer):
    label = serializers.CharField(help_text="e.g. 'compile seconds', 'graph breaks', 'FX graph cache'")
    value = ANY(help_text="as the section reported it ('3 hits · 1 miss' for a cache)")


class CompiledServeSerializer(serializers.Serializer):
    enabled = ANY(help_text="whether the server ran compiled (false: it ran eager, see reason)")
    reason = ANY(help_text="why it ran eager, when it did")
    rows = CompileRowSerializer(many=True, help_text="the page's rows; empty when the server ran eager")
    breaks = serializers.ListField(child=ANY(), help_text="the first five graph-break reasons")
    recompile_reasons = serializers.ListField(child=serializers.CharField(), help_text="the first five")


class CompiledBenchSerializer(serializers.Serializer):
    enabled = ANY()
    reason = ANY()
    concurrency = ANY(help_text="the concurrency compiled and eager were measured at")
    note = ANY(help_text="how they were measured (one after the other on a shared device: noise)")
    compiled_tok_s = _nullable_float("compiled output tokens/s")
    eager_tok_s = _nullable_float("eager output tokens/s")
    compiled_tpot = _nullable_float("compiled TPOT p50, ms")
    eager_tpot = _nullable_float("eager TPOT p50, ms")
    speedup = _nullable_float("compiled / eager output tokens/s")


class CompiledAlignSerializer(serializers.Serializer):
    enabled = ANY()
    reason = ANY()
    passed = ANY(help_text="compiled-vs-eager greedy tokens within the gate")
    equal = ANY(help_text="every token equal")
    match_rate = _nullable_float("fraction of greedy tokens equal")
    tokens = ANY(help_text="tokens compared")
    prompts = ANY()
    first = ANY(help_text="the first divergence (prompt, position, eager and compiled tokens, near_tie), or null")
    divergences = serializers.IntegerField(help_text="how many divergences")
    rows = CompileRowSerializer(many=True)


class CompiledPathSerializer(serializers.Serializer):
    jobs = serializers.DictField(child=serializers.IntegerField(), help_text="stage -> job of its compile block")
    serve = CompiledServeSerializer(required=False, help_text="only when the serve section has a compile block")
    bench = CompiledBenchSerializer(required=False, help_text="only when the bench section has a compile block")
    align = CompiledAlignSerializer(required=False, help_text="only when the align section has a compile block")


class ExpertBalanceSerializer(serializers.Serializer):
    layers = ANY()
    experts = ANY()
    max_over_mean = ANY(help_text="max / mean tokens per expert")
    worst_layer_max_over_mean = ANY()
    cv = ANY(help_text="coefficient of variation of tokens per expert")
    routed_tokens = ANY()
    ep_size = ANY()
    ep_max_over_mean = ANY(help_text="max / mean tokens per EP rank")
    tokens_per_expert = serializers.ListField(child=serializers.FloatField(), help_text="at most 512 (cut: more)")
    tokens_per_ep_rank = serializers.ListField(child=serializers.FloatField())
    cut = serializers.BooleanField(help_text="tokens_per_expert was cut to the first 512 experts")
    min_tokens = _nullable_float("fewest tokens of one expert")
    max_tokens = _nullable_float("most tokens of one expert")


class BenchRunEvidenceSerializer(serializers.Serializer):
    concurrency = ANY()
    long_context = serializers.BooleanField(help_text="the bench section's long-context run (after the sweep)")
    comm_overhead_ratio = _nullable_float("rank 0's time in collectives / step time (a fraction)")
    comm_overhead_ratio_per_rank = serializers.ListField(
        child=serializers.FloatField(allow_null=True), help_text="per rank, when there are several; else empty")
    comm_overhead_ratio_max = _nullable_float("the slowest rank's fraction")
    tpot_jitter = _nullable_float("TPOT p99 / p50 (from the percentiles for runs recorded before the key)")
    expert_balance = ExpertBalanceSerializer(allow_null=True, help_text="null when the model routes no experts")


class SoakWindowMemorySerializer(serializers.Serializer):
    t = serializers.FloatField(help_text="seconds into the soak")
    allocated_bytes = serializers.IntegerField()
    max_allocated_bytes = serializers.IntegerField(allow_null=True)


class SoakDeviceMemorySerializer(serializers.Serializer):
    job = serializers.IntegerField(allow_null=True)
    reported = serializers.BooleanField(help_text="the section has a device_memory block")
    source = serializers.CharField(allow_null=True, help_text="'torch.cuda', or 'cpu: process RSS'")
    memory_slope = _nullable_float("bytes per second")
    note = serializers.CharField(allow_null=True)
    windows = SoakWindowMemorySerializer(many=True, help_text="per window; empty on CPU")
    min_bytes = serializers.IntegerField(allow_null=True)
    max_bytes = serializers.IntegerField(allow_null=True)


class RuntimeEvidenceSerializer(serializers.Serializer):
    compiled_path = CompiledPathSerializer(allow_null=True, help_text="null when no section has a compile block")
    bench_job = serializers.IntegerField(allow_null=True, help_text="the job of the newest bench section")
    bench_runs = BenchRunEvidenceSerializer(many=True, help_text="one per run of the newest bench section")
    soak_device_memory = SoakDeviceMemorySerializer(allow_null=True, help_text="null without soak memory keys")


class CellDetailSerializer(serializers.Serializer):
    model = serializers.CharField()
    hardware = serializers.CharField()
    engine = serializers.CharField(help_text="the engine whose cell this is, NAME@VERSION (day0 by default)")
    engines = ANY(help_text="every engine's cell of this model × hardware, best first: {engine, name, version, "
                            "default, tier, tier_name, failed_stage, jobs, previous_version, previous_tier, regressed}")
    tier = ANY()
    tier_name = ANY()
    failed_stage = ANY()
    error = ANY()
    stage_passed = ANY()
    verdicts = ANY()
    disputed = ANY()
    custom_thresholds = ANY()
    synthetic = ANY()
    manifest = ANY()
    digest_conflict = ANY()
    tier_reached_at = ANY()
    lead_time_hours = ANY()
    fits = ANY()
    evidence = ANY(help_text="the newest section of each stage as stored, checklist, alignment, benchmarks")
    runtime_evidence = RuntimeEvidenceSerializer(
        help_text="what the cell page shows of the runtime: compiled path, per bench run comm overhead, TPOT "
                  "jitter, expert balance, soak device memory")
    conformance = ANY(help_text="the newest conformance section's checks: {job, verdict, template_declares_tools, "
                                "thinking, tool_call_parser, reasoning_parser, repeats, rows: [{check, passed (the "
                                "portal's, recomputed), claimed, detail, target, reference}]}; null without one")
    stack = ANY()
    jobs = JobSerializer(many=True)
    history = ANY(help_text="tier changes and re-judgings, newest first: {at, kind, tier_before, tier_after, reason, "
                            "data}")
