from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.catalog.choices import DTYPE_NAMES
from apps.jobs.models import Job, JobEvent
from apps.jobs.selectors import engine_label, job_waiting_reason
from contract.events import EVENT_MESSAGE_MAX, failed_stage_problem
from contract.planner.memory import ALIASES as DTYPE_ALIASES
from contract.thresholds import check_thresholds, looser_keys
from contract.tiers import DEFAULT_STAGES, STAGE_ORDER

# Bounds of the bench settings a job may carry (the bench, comm, eval and soak stages read ``spec.bench``):
# key -> (lowest, highest, integers only). Any other number in ``bench`` is bounded by JSON_INT_BOUND.
BENCH_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "input_len": (1, 1 << 20, True), "output_len": (1, 1 << 20, True), "long_input_len": (1, 1 << 20, True),
    "num_prompts": (1, 100_000, True), "max_concurrency": (1, 4096, True), "request_rate": (1e-3, 10_000, False),
    "ready_timeout": (1, 86_400, False), "seed": (0, 2**63 - 1, True), "min_seconds": (0, 86_400, False),
    # the comm stage's sweep (agents/pipeline/stages/comm.py checks the same bounds when it runs)
    "comm_min_bytes": (8, 1 << 34, True), "comm_max_bytes": (8, 1 << 34, True), "comm_factor": (2, 1024, True),
    "comm_iters": (1, 10_000, True), "comm_warmup": (0, 1000, True), "comm_timeout_s": (0.001, 3600, False),
    "comm_ranks": (1, 64, True),
}
MAX_CONCURRENCY_LEVELS = 32
MAX_BENCH_KEYS = 64
JSON_INT_BOUND = 2**53  # exact in every JSON reader (JavaScript's Number, float64 columns)


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
    engine = serializers.CharField(required=False, max_length=140,
                                   help_text="the serving engine, NAME or NAME@VERSION (GET /api/v1/engines/); "
                                             "absent: day0, the bundled runtime")
    engine_command = serializers.CharField(required=False, max_length=4000,
                                           help_text="the engine's launch command template (openai-compatible)")

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
        """A dtype name, or one of the short names ``day0 estimate`` takes (``fp8``, ``bf16`` …)."""
        value = DTYPE_ALIASES.get(value.strip().lower(), value)
        if value not in DTYPE_NAMES:
            raise serializers.ValidationError(f"unknown dtype {value!r}; known: {', '.join(sorted(DTYPE_NAMES))} "
                                              f"(or {', '.join(DTYPE_ALIASES)})")
        return value

    def validate_bench(self, value: dict[str, Any]) -> dict[str, Any]:
        """Bounded settings: each known key within its range, ``concurrency`` a short list of levels, every other
        number within ±2**53 (a 400 names the key and the bound)."""
        if len(value) > MAX_BENCH_KEYS:
            raise serializers.ValidationError(f"at most {MAX_BENCH_KEYS} settings, got {len(value)}")
        conc = value.get("concurrency")
        if conc is not None and not (isinstance(conc, list) and 0 < len(conc) <= MAX_CONCURRENCY_LEVELS and all(
                isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 4096 for c in conc)):
            raise serializers.ValidationError({"concurrency": [f"must be a list of 1 to {MAX_CONCURRENCY_LEVELS} "
                                                               "integers from 1 to 4096"]})
        for key, (low, high, integral) in BENCH_BOUNDS.items():
            v = value.get(key)
            if v is None:
                continue
            kind = "an integer" if integral else "a number"
            if isinstance(v, bool) or not isinstance(v, int if integral else int | float) or not low <= v <= high:
                raise serializers.ValidationError(
                    {key: [f"must be {kind} from {_bound(low)} to {_bound(high)}, got {v!r}"]})
        for flag in ("compile", "probe"):  # the compiled path (serve --compile); the repeated-prompt probe
            if flag in value and not isinstance(value[flag], bool):
                raise serializers.ValidationError({flag: [f"must be true or false, got {value[flag]!r}"]})
        serve_args = value.get("serve_args")
        if serve_args is not None and not (isinstance(serve_args, list) and len(serve_args) <= 64 and all(
                isinstance(a, str) and len(a) <= 256 for a in serve_args)):
            raise serializers.ValidationError({"serve_args": ["must be a list of at most 64 strings of at most "
                                                              "256 characters"]})
        for key, v in value.items():
            bad = _first_unbounded_number(v)
            if bad is not None:
                raise serializers.ValidationError({key: [f"numbers must lie within ±2**53, got {bad!r}"]})
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
            # resolved against the catalog by services.check_job_spec (absent: the spec is as it always was)
            **{key: data[key] for key in ("engine", "engine_command") if data.get(key)},
        }


def _first_unbounded_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value if abs(value) > JSON_INT_BOUND else None
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        bad = _first_unbounded_number(child)
        if bad is not None:
            return bad
    return None


class JobSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.slug", read_only=True)
    hardware = serializers.CharField(source="hardware.slug", read_only=True)
    organization = serializers.CharField(source="organization.slug", read_only=True, default=None, allow_null=True)
    requested_by = serializers.CharField(source="requested_by.username", read_only=True, default=None,
                                         allow_null=True)
    waiting_reason = serializers.SerializerMethodField(
        help_text="why a dispatched job is not claimed yet, once it waited DAY0_JOB_STUCK_SECONDS; else null")
    stuck = serializers.SerializerMethodField(help_text="true when waiting_reason is set")
    manifest = serializers.JSONField(source="model.manifest", read_only=True,
                                     help_text="the release's checksum manifest [{name, size, sha256}] the portal "
                                               "compares every load with; empty when none is known yet. Not in what "
                                               "an agent token reads: the agent reports digests, the portal compares")
    custom_thresholds = serializers.SerializerMethodField(
        help_text="the job's threshold overrides looser than the defaults (its tiers are marked custom)")
    engine = serializers.SerializerMethodField(help_text="the serving engine the job runs, NAME@VERSION (day0: "
                                                         "the bundled runtime)")
    node_rows = serializers.SerializerMethodField(
        help_text="a multi-node job's hosts at its current attempt: [{rank, agent, state, master_addr, master_port, "
                  "error, events_acked}] (empty for one node)")

    class Meta:
        model = Job
        fields = ["id", "model", "hardware", "organization", "requested_by", "spec", "state", "attempts", "agent",
                  "failed_stage", "error", "events_acked", "created_at", "updated_at", "dispatched_at", "started_at",
                  "finished_at", "stuck", "waiting_reason", "manifest", "custom_thresholds", "nodes", "node_rows", "engine"]
        read_only_fields = fields

    def to_representation(self, job: Job) -> dict:
        data = super().to_representation(job)
        request = self.context.get("request")
        token = getattr(getattr(request, "auth", None), "hardware_id", None) if request is not None else None
        if token is not None:  # an agent token: it proves its load by reporting digests, never by echoing ours
            data["manifest"] = None  # the key stays (the schema's), its digests never reach an agent
        return data

    def get_node_rows(self, job: Job) -> list[dict]:
        if job.nodes <= 1:
            return []
        rows = job.node_rows.filter(attempt=job.attempts).values(
            "rank", "agent", "state", "master_addr", "master_port", "error", "events_acked")
        return list(rows)

    def get_engine(self, job: Job) -> str:
        return engine_label(job.spec)

    def get_custom_thresholds(self, job: Job) -> list[str]:
        return looser_keys(job.spec.get("thresholds") or {})

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
    error = serializers.CharField(required=False, allow_blank=True, max_length=EVENT_MESSAGE_MAX)
    agent = serializers.IntegerField(required=False, allow_null=True)
    attempt = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=2**31 - 1)

    def validate_failed_stage(self, value: str) -> str:
        problem = failed_stage_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value


def _bound(value: float) -> str:
    """A bound as people read it: 17179869184 (2**34), not 1.71799e+10."""
    if isinstance(value, int) or float(value).is_integer():
        n = int(value)
        power = n.bit_length() - 1
        return f"{n} (2**{power})" if n > 1024 and n == 1 << power else str(n)
    return f"{value:g}"


class JobNodeStateSerializer(serializers.Serializer):
    """A multi-node job's other node (rank > 0) reports its reservation's state."""

    state = serializers.ChoiceField(choices=["running", "finished", "failed"])
    attempt = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=2**31 - 1)
    error = serializers.CharField(required=False, allow_blank=True, max_length=EVENT_MESSAGE_MAX)
