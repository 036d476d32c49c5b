"""The facts the portal judges a job's sections with (``contract.verdicts.Context``): built at ingest
(``services``) and when stored results are judged again (``rejudge``)."""

from __future__ import annotations

from typing import Any

from apps.evidence import weights
from apps.evidence.judging_facts import physics_facts, reference_declares_tools
from apps.evidence.models import StageResult
from apps.jobs.models import Job
from apps.references.services import challenge_judge
from contract import verdicts


def judging_context(job: Job, sections: dict[str, dict[str, Any]] | None = None) -> verdicts.Context:
    """The facts the portal judges a job's sections with: its release (config, manifest, tensor count, chat
    template, images, context), its hardware (for the plan), its dtype. Which path runs the model (native or
    the fallback, which has no paged KV cache) comes from the job's load evidence."""
    model, hardware = job.model, job.hardware
    load = (sections or {}).get("load")
    if not isinstance(load, dict):
        stored = StageResult.objects.filter(job=job, stage="load").values_list("section", flat=True).first()
        load = stored if isinstance(stored, dict) else {}
    has_template = model.has_chat_template
    if has_template is None and any(str(m.get("name")) == "chat_template.jinja" for m in model.manifest or []):
        has_template = True
    physics = physics_facts(job, sections or {})
    return verdicts.Context(
        model=verdicts.ModelFacts(
            config=model.config, has_chat_template=has_template, takes_images=model.takes_images,
            declared_tensors=model.tensor_count, manifest=model.manifest or None,
            manifest_source=model.manifest_source, context_length=model.context_length,
            runtime_path=load.get("path") if isinstance(load.get("path"), str) else None,
            template_declares_tools=reference_declares_tools(model.pk),
        ),
        weight_probe=weights.probe_facts(job, stored=sections is None) if sections is None or "load" in sections
        else None,
        hardware=verdicts.HardwareFacts(memory_bytes=hardware.memory_bytes, devices_per_node=hardware.devices_per_node,
                                        shared_memory=hardware.shared_memory, dtypes=tuple(hardware.dtypes or ()),
                                        memory_bandwidth_gbps=hardware.memory_bandwidth_gbps,
                                        owned=hardware.organization_id is not None),
        dtype=job.spec.get("dtype") or "auto", **physics,
        challenge=challenge_judge(job),  # the portal judges e2e and eval from its own scores
        engine=(job.spec.get("engine") or {}).get("name") if isinstance(job.spec.get("engine"), dict) else None,
    )
