"""The cell page's "Run adaptation" form: what it asks (stages, dtype, threshold preset, bench settings, plan
overrides), the API payload it becomes, and the equivalent ``day0 jobs submit`` command and curl call. The
payload is validated by the API's own ``JobCreateSerializer`` and the job created through the API's one creation
check (``apps.jobs.services.check_create_job``: context lengths, dtype, layout, then who may create), and a
dtype left out defaults as the API's does, so the browser and the API accept and refuse the same things."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from apps.accounts.access import Actor
from apps.accounts.choices import Scope
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import model_is_public
from apps.jobs.services import default_dtype
from contract.thresholds import TABLE as THRESHOLDS
from contract.tiers import DEFAULT_STAGES, STAGE_ORDER

# Named sets of threshold overrides (the empty one: the versioned defaults). A looser set marks the job and
# every tier it reaches "custom thresholds".
THRESHOLD_PRESETS: dict[str, tuple[str, dict[str, float]]] = {
    "default": ("versioned defaults", {}),
    "strict": ("strict: op cosine ≥ 0.9999, layer cosine ≥ 0.999",
               {"op_cosine": 0.9999, "layer_cosine": 0.999, "op_max_rel_err": 5e-3}),
    "fp8": ("low precision (FP8/int8): op cosine ≥ 0.99, layer cosine ≥ 0.98 — marked custom",
            {"op_cosine": 0.99, "layer_cosine": 0.98, "op_max_rel_err": 5e-2}),
}
BENCH_FIELDS = (("input_len", "input tokens"), ("output_len", "output tokens"), ("num_prompts", "prompts"))


def may_submit(actor: Actor, model: ModelRelease) -> bool:
    """Whether ``actor`` may create a job of ``model`` (the rule ``check_create_job`` enforces)."""
    org_id = actor.default_org_id() if model_is_public(model) else model.organization_id
    return actor.has_scope(Scope.SUBMIT, org_id)


@dataclass
class RunForm:
    """The form's values (as typed), the payload they make, and the errors naming the bad field."""

    model: ModelRelease
    hardware: Hardware
    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def initial(cls, model: ModelRelease, hardware: Hardware) -> RunForm:
        return cls(model, hardware, {"stages": list(DEFAULT_STAGES), "dtype": default_dtype(hardware),
                                     "preset": "default", "concurrency": "1,4,16", "input_len": "", "output_len": "",
                                     "num_prompts": "", "tp": "", "pp": "", "ep": "", "thresholds": ""})

    @classmethod
    def from_post(cls, model: ModelRelease, hardware: Hardware, post: Any) -> RunForm:
        form = cls(model, hardware)
        form.values = {"stages": [s for s in post.getlist("stages") if s in STAGE_ORDER],
                       **{k: (post.get(k) or "").strip()[:200] for k in (
                           "dtype", "preset", "concurrency", "input_len", "output_len", "num_prompts", "tp", "pp",
                           "ep", "thresholds")}}
        return form

    def payload(self) -> dict[str, Any]:
        """The JSON body of ``POST /api/v1/jobs/``; a value that is not a number is kept as typed, for the
        serializer to refuse by name."""
        v = self.values
        body: dict[str, Any] = {"model": self.model.slug, "hardware": self.hardware.slug, "stages": v["stages"]}
        if v.get("dtype"):
            body["dtype"] = v["dtype"]
        for key in ("tp", "pp", "ep"):
            if v.get(key):
                body[key] = _number(v[key])
        thresholds = dict(THRESHOLD_PRESETS.get(v.get("preset") or "default", ("", {}))[1])
        for item in (v.get("thresholds") or "").replace(";", ",").split(","):
            if "=" in item:
                key, _, raw = item.partition("=")
                thresholds[key.strip()] = _number(raw.strip())
            elif item.strip():
                self.errors["thresholds"] = f"write overrides as key=value, got {item.strip()!r}"
        if thresholds:
            body["thresholds"] = thresholds
        bench: dict[str, Any] = {}
        if v.get("concurrency"):
            bench["concurrency"] = [_number(c.strip()) for c in v["concurrency"].split(",") if c.strip()]
        for key, _ in BENCH_FIELDS:
            if v.get(key):
                bench[key] = _number(v[key])
        if bench:
            body["bench"] = bench
        if v.get("preset") not in THRESHOLD_PRESETS:
            self.errors["preset"] = f"unknown preset; choose one of {', '.join(THRESHOLD_PRESETS)}"
        if not v["stages"]:
            self.errors["stages"] = "choose at least one stage"
        return body

    def cli(self, portal: str) -> str:
        """The equivalent ``day0 jobs submit`` (the CLI's flags; overrides it has no flag for go in the API call)."""
        body = self.payload()
        parts = ["day0", "jobs", "submit", "--portal", portal, "--model", self.model.slug, "--hardware",
                 self.hardware.slug, "--stages", ",".join(body["stages"])]
        if body.get("dtype"):
            parts += ["--dtype", body["dtype"]]
        return shlex.join(parts) + " --watch"

    def extra_only_in_api(self) -> list[str]:
        body = self.payload()
        return [k for k in ("tp", "pp", "ep", "thresholds", "bench") if k in body]

    def curl(self, portal: str) -> str:
        body = json.dumps(self.payload(), separators=(",", ":"))
        return (f"curl -sS -X POST {shlex.quote(portal + '/api/v1/jobs/')} -H \"Authorization: Bearer $DAY0_TOKEN\" "
                f"-H 'Content-Type: application/json' -d {shlex.quote(body)}")


def _number(raw: str) -> Any:
    try:
        value = float(raw)
    except ValueError:
        return raw
    return int(value) if value.is_integer() else value


def threshold_help() -> list[tuple[str, str, str]]:
    """(key, default, doc) of every threshold a job may override, for the form's help."""
    return [(t.key, f"{t.default:g}", t.doc) for t in THRESHOLDS.values()]
