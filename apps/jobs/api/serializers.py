from __future__ import annotations

from typing import Any

from rest_framework import serializers

from agents.pipeline.thresholds import check_thresholds
from agents.pipeline.tiers import DEFAULT_STAGES, STAGE_ORDER
from apps.catalog.api.serializers import DTYPE_NAMES
from apps.jobs.models import Job, JobEvent
from apps.jobs.selectors import job_waiting_reason

BENCH_INT_KEYS = ("input_len", "output_len", "num_prompts", "request_rate", "max_concurrency")


class JobCreateSerializer(serializers.Serializer):
    """What a job asks for; the model and hardware are slugs."""

    model = serializers.CharField(max_length=100)
    hardware = serializers.CharField(max_length=64)
    stages = serializers.ListField(child=serializers.CharField(max_length=32), required=False, allow_empty=False)
    dtype = serializers.CharField(required=False, max_length=32)
    tp = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=4096)
    pp = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=4096)
    ep = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=4096)
    thresholds = serializers.DictField(child=serializers.FloatField(), required=False)
    bench = serializers.DictField(required=False)

    def validate_stages(self, value: list[str]) -> list[str]:
        unknown = [s for s in value if s not in STAGE_ORDER]
        if unknown:
            raise serializers.ValidationError(f"unknown stages {unknown}; stages are {', '.join(STAGE_ORDER)}")
        if len(set(value)) != len(value):
            raise serializers.ValidationError("a stage is listed twice")
        return [s for s in STAGE_ORDER if s in value]  # the pipeline's order

    def validate_thresholds(self, value: dict[str, float]) -> dict[str, float]:
        """Only keys a stage reads: a misspelt override would otherwise be ignored by the agent."""
        try:
            return check_thresholds(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_dtype(self, value: str) -> str:
        if value not in DTYPE_NAMES:
            raise serializers.ValidationError(f"unknown dtype {value!r}; known: {sorted(DTYPE_NAMES)}")
        return value

    def validate_bench(self, value: dict[str, Any]) -> dict[str, Any]:
        conc = value.get("concurrency")
        if conc is not None and not (isinstance(conc, list) and conc and all(
                isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 4096 for c in conc)):
            raise serializers.ValidationError({"concurrency": "must be a non-empty list of integers from 1 to 4096"})
        for key in BENCH_INT_KEYS:
            v = value.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
                raise serializers.ValidationError({key: "must be a positive number"})
        return value

    def spec(self) -> dict[str, Any]:
        data = self.validated_data
        return {
            "stages": data.get("stages") or list(DEFAULT_STAGES),
            "dtype": data.get("dtype"),
            "tp": data.get("tp"),
            "pp": data.get("pp"),
            "ep": data.get("ep"),
            "thresholds": data.get("thresholds") or {},
            "bench": data.get("bench") or {},
        }


class JobSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.slug", read_only=True)
    hardware = serializers.CharField(source="hardware.slug", read_only=True)
    organization = serializers.CharField(source="organization.slug", read_only=True, default=None)
    requested_by = serializers.CharField(source="requested_by.username", read_only=True, default=None)
    waiting_reason = serializers.SerializerMethodField(
        help_text="why a dispatched job is not claimed yet, once it waited DAY0_JOB_STUCK_SECONDS; else null")
    stuck = serializers.SerializerMethodField(help_text="true when waiting_reason is set")

    class Meta:
        model = Job
        fields = ["id", "model", "hardware", "organization", "requested_by", "spec", "state", "attempts", "agent",
                  "failed_stage", "error", "events_acked", "created_at", "updated_at", "dispatched_at", "started_at",
                  "finished_at", "stuck", "waiting_reason"]
        read_only_fields = fields

    def get_waiting_reason(self, job: Job) -> str | None:
        if not hasattr(job, "_waiting_reason"):
            job._waiting_reason = job_waiting_reason(job)
        return job._waiting_reason

    def get_stuck(self, job: Job) -> bool:
        return self.get_waiting_reason(job) is not None


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["seq", "ts", "stage", "kind", "level", "message", "data"]


class JobStateSerializer(serializers.Serializer):
    """An agent's report of a job's state."""

    state = serializers.ChoiceField(choices=["dispatched", "running", "succeeded", "failed", "lost", "queued"])
    failed_stage = serializers.CharField(required=False, allow_blank=True, max_length=32)
    error = serializers.CharField(required=False, allow_blank=True, max_length=100_000)
    agent = serializers.IntegerField(required=False, allow_null=True)
    attempt = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=2**31 - 1)
