"""The evidence each pipeline stage leaves, as queryable rows (the sections of the stage report agents post).

Every stage result is one ``StageResult`` (the section as it arrived, and whether it passes the tier rule)
plus typed rows derived from it. Posting a stage again for the same job replaces its rows."""

from __future__ import annotations

from django.db import models


class StageResult(models.Model):
    """One stage's section of one job's report and the portal's verdict on it.

    ``verdict`` is computed by the portal (``contract.verdicts``) from the numbers in the section, with
    the job's thresholds over the defaults of ``defaults_version``; ``passed`` is ``verdict == "pass"``.
    ``claimed_passed`` is the agent's own flag, kept as a claim and never read by a tier. ``synthetic``: written
    by ``seed_evidence``, not by an agent."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="stage_results")
    stage = models.CharField(max_length=32)
    passed = models.BooleanField()
    verdict = models.CharField(max_length=16, default="incomplete")  # pass | fail | incomplete
    reasons = models.JSONField(default=list, blank=True)  # sentences naming the part, empty when passing
    verdict_notes = models.JSONField(default=list, blank=True)
    defaults_version = models.CharField(max_length=32, blank=True)
    custom_thresholds = models.JSONField(default=list, blank=True)  # the job's keys looser than the defaults
    claimed_passed = models.BooleanField(null=True)
    synthetic = models.BooleanField(default=False)
    section = models.JSONField()
    # align / eval: the portal's own scores of the raw outputs against its reference (apps/references)
    challenge_scores = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0, help_text="the job's attempt the section was posted under")
    judged_at = models.DateTimeField(null=True, blank=True, help_text="when the verdict was last re-judged")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    @property
    def disputed(self) -> bool:
        """The agent claimed a pass (or a failure) that the portal's verdict does not share."""
        return self.claimed_passed is not None and self.claimed_passed != (self.verdict == "pass")

    def summary(self) -> dict:
        """What the results API answers for a stored stage."""
        return {"stage": self.stage, "passed": self.passed, "verdict": self.verdict, "reasons": self.reasons,
                "claimed_passed": self.claimed_passed, "disputed": self.disputed,
                "defaults_version": self.defaults_version, "custom_thresholds": self.custom_thresholds,
                "synthetic": self.synthetic, "scores": self.challenge_scores}

    class Meta:
        ordering = ["job_id", "created_at"]
        constraints = [models.UniqueConstraint(fields=["job", "stage"], name="uniq_stage_result")]

    def __str__(self) -> str:
        return f"{self.job_id}:{self.stage} {self.verdict}"


class PlanEvidence(models.Model):
    """The resource plan: parameters, bytes and the chosen TP × PP × EP layout."""

    result = models.OneToOneField(StageResult, on_delete=models.CASCADE, related_name="plan")
    params_total = models.BigIntegerField(null=True)
    params_active = models.BigIntegerField(null=True)
    weight_bytes = models.BigIntegerField(null=True)
    kv_bytes_per_token = models.BigIntegerField(null=True)
    tp = models.IntegerField(null=True)
    pp = models.IntegerField(null=True)
    ep = models.IntegerField(null=True)
    devices = models.IntegerField(null=True)
    fits = models.BooleanField(default=False)
    bytes_per_device = models.BigIntegerField(null=True)
    max_context = models.BigIntegerField(null=True)
    max_batch = models.IntegerField(null=True)
    dtype = models.CharField(max_length=32, blank=True)


class LoadReport(models.Model):
    """Weight loading: tensors verified, bytes, speed, peak RSS."""

    result = models.OneToOneField(StageResult, on_delete=models.CASCADE, related_name="load")
    ok = models.BooleanField()
    tensors = models.IntegerField(null=True)
    bytes = models.BigIntegerField(null=True)
    seconds = models.FloatField(null=True)
    gb_per_s = models.FloatField(null=True)
    peak_rss_bytes = models.BigIntegerField(null=True)


class ShardChecksum(models.Model):
    """A checkpoint shard's sha256 as loaded."""

    load = models.ForeignKey(LoadReport, on_delete=models.CASCADE, related_name="shards")
    file = models.CharField(max_length=255)
    sha256 = models.CharField(max_length=64)


class LoadProblem(models.Model):
    """A tensor that failed verification (missing, unexpected, wrong shape or dtype, non-finite)."""

    load = models.ForeignKey(LoadReport, on_delete=models.CASCADE, related_name="problems")
    tensor = models.CharField(max_length=255)
    problem = models.TextField()


class OperatorCheck(models.Model):
    """One row of the operator checklist: an aten op seen in prefill/decode and its support status."""

    result = models.ForeignKey(StageResult, on_delete=models.CASCADE, related_name="operators")
    op = models.CharField(max_length=200)
    count = models.IntegerField(default=0)
    dtypes = models.JSONField(default=list)
    status = models.CharField(max_length=16, db_index=True)  # native | decomposed | fallback | missing
    decomposes_to = models.JSONField(default=list)


class AlignmentReport(models.Model):
    """Alignment against the fp32 reference: end-to-end and KV-cache summaries; ops and layers as rows."""

    result = models.OneToOneField(StageResult, on_delete=models.CASCADE, related_name="alignment")
    passed = models.BooleanField()
    thresholds = models.JSONField(default=dict)
    e2e_prompts = models.IntegerField(null=True)
    e2e_tokens = models.IntegerField(null=True)
    token_match_rate = models.FloatField(null=True)
    perplexity_ref = models.FloatField(null=True)
    perplexity_target = models.FloatField(null=True)
    kv_passed = models.BooleanField(null=True)
    kv_max_abs_err = models.FloatField(null=True)
    kv_lengths = models.JSONField(default=list)


class AlignmentOp(models.Model):
    """Per-operator alignment on fixed random inputs."""

    report = models.ForeignKey(AlignmentReport, on_delete=models.CASCADE, related_name="ops")
    op = models.CharField(max_length=200)
    cosine = models.FloatField(null=True)
    max_rel_err = models.FloatField(null=True)
    max_abs_err = models.FloatField(null=True)
    passed = models.BooleanField()


class AlignmentLayer(models.Model):
    """Per-layer hidden-state alignment."""

    report = models.ForeignKey(AlignmentReport, on_delete=models.CASCADE, related_name="layers")
    layer = models.IntegerField()
    cosine = models.FloatField(null=True)
    max_rel_err = models.FloatField(null=True)
    passed = models.BooleanField()


class TokenDivergence(models.Model):
    """Where greedy decoding first diverged from the reference, with both sides' top-5."""

    report = models.ForeignKey(AlignmentReport, on_delete=models.CASCADE, related_name="divergences")
    prompt = models.IntegerField()
    position = models.IntegerField()
    ref_token = models.BigIntegerField(null=True)
    target_token = models.BigIntegerField(null=True)
    ref_top5 = models.JSONField(default=list)
    target_top5 = models.JSONField(default=list)
    near_tie = models.BooleanField(default=False)


class ServeReport(models.Model):
    """The runtime server came up and answered the text path."""

    result = models.OneToOneField(StageResult, on_delete=models.CASCADE, related_name="serve")
    ready_seconds = models.FloatField(null=True)
    endpoint = models.CharField(max_length=255, blank=True)
    text_path_ok = models.BooleanField()


class BenchmarkRun(models.Model):
    """A serving benchmark of one job; model and hardware are denormalized for time-series queries."""

    result = models.OneToOneField(StageResult, on_delete=models.CASCADE, related_name="benchmark")
    model = models.ForeignKey("catalog.ModelRelease", on_delete=models.CASCADE, related_name="benchmark_runs")
    hardware = models.ForeignKey("catalog.Hardware", on_delete=models.CASCADE, related_name="benchmark_runs")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["model", "hardware", "created_at"], name="bench_series")]


LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
LATENCY_STATS: tuple[str, ...] = ("mean", "p50", "p90", "p99")


class BenchmarkPoint(models.Model):
    """One concurrency level of a benchmark run: latency percentiles and throughput."""

    run = models.ForeignKey(BenchmarkRun, on_delete=models.CASCADE, related_name="points")
    concurrency = models.IntegerField()
    ttft_ms_mean = models.FloatField(null=True)
    ttft_ms_p50 = models.FloatField(null=True)
    ttft_ms_p90 = models.FloatField(null=True)
    ttft_ms_p99 = models.FloatField(null=True)
    tpot_ms_mean = models.FloatField(null=True)
    tpot_ms_p50 = models.FloatField(null=True)
    tpot_ms_p90 = models.FloatField(null=True)
    tpot_ms_p99 = models.FloatField(null=True)
    itl_ms_mean = models.FloatField(null=True)
    itl_ms_p50 = models.FloatField(null=True)
    itl_ms_p90 = models.FloatField(null=True)
    itl_ms_p99 = models.FloatField(null=True)
    e2e_ms_mean = models.FloatField(null=True)
    e2e_ms_p50 = models.FloatField(null=True)
    e2e_ms_p90 = models.FloatField(null=True)
    e2e_ms_p99 = models.FloatField(null=True)
    output_tok_s = models.FloatField(null=True)
    req_s = models.FloatField(null=True)
    peak_memory_bytes = models.BigIntegerField(null=True)
    failed = models.IntegerField(default=0)

    class Meta:
        ordering = ["run_id", "concurrency"]


class EnvLock(models.Model):
    """The versions a job ran with."""

    result = models.OneToOneField(StageResult, on_delete=models.CASCADE, related_name="env")
    runtime_commit = models.CharField(max_length=64, blank=True)
    torch = models.CharField(max_length=64, blank=True)
    python = models.CharField(max_length=64, blank=True)
    device = models.CharField(max_length=200, blank=True)
    device_count = models.IntegerField(null=True)
    dispatch_key = models.CharField(max_length=64, blank=True)
    driver = models.CharField(max_length=200, blank=True)


class WeightSamples(models.Model):
    """Bytes of one weight file of a release at offsets the portal chose, read by the release's reference run
    (``weight_samples`` of its load). Secret: no API answers them; certify jobs are probed against them."""

    model = models.ForeignKey("catalog.ModelRelease", on_delete=models.CASCADE, related_name="weight_samples")
    file = models.CharField(max_length=255)
    size = models.BigIntegerField()
    samples = models.JSONField()  # [[offset, hex of the bytes there], ...]
    job = models.ForeignKey("jobs.Job", null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "file"], name="uniq_weight_samples_file")]


class WeightDraw(models.Model):
    """What one attempt of a job was asked about its weights, kept secret: a reference job's sample positions
    (``kind`` "samples": ``{"count", "length", "positions"}``) or a certify job's probes (``kind`` "probe":
    ``{"probes": [{"file", "offset", "length"}]}``), with the nonce the attempt carried and the agent's answers."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="weight_draws")
    attempt = models.PositiveIntegerField()
    nonce = models.CharField(max_length=64)
    kind = models.CharField(max_length=16)  # samples | probe
    spec = models.JSONField()
    answers = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "attempt"], name="uniq_weight_draw_attempt")]
