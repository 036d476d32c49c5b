"""The catalog: open-weights model releases and accelerators."""

from __future__ import annotations

from django.db import models

from apps.catalog.choices import Visibility
from apps.core.validators import slug_validator


class ModelRelease(models.Model):
    """A released (or embargoed) model, described by its ``config.json``. Parameter counts, architecture,
    family and context length are computed from the config, never typed in."""

    slug = models.CharField(max_length=100, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="models")
    hf_repo = models.CharField(max_length=200, blank=True)
    architecture = models.CharField(max_length=100)
    family = models.CharField(max_length=32, db_index=True)
    params_total = models.BigIntegerField()
    params_active = models.BigIntegerField()
    published_params_total = models.BigIntegerField(null=True, blank=True)
    published_params_active = models.BigIntegerField(null=True, blank=True)
    context_length = models.IntegerField()
    dtype = models.CharField(max_length=32, default="bfloat16")
    modalities = models.JSONField(default=list, blank=True)
    released_at = models.DateTimeField(null=True, blank=True, db_index=True)
    config = models.JSONField()
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.PUBLIC)
    # the checksum manifest of the weight files, [{"name", "size", "sha256"}]: given by the release's creator
    # ("given"), set by staff ("staff", also when they settle a disagreement), or recorded by the reference run's
    # load ("reference"); every load is compared with it. "first seen (legacy)": a vendor's first passing load,
    # recorded before that rule; shown, never compared with (apps/evidence/manifests.py)
    manifest = models.JSONField(default=list, blank=True)
    manifest_source = models.CharField(max_length=32, blank=True)  # "" | given | staff | reference | legacy
    manifest_seen = models.JSONField(default=dict, blank=True)  # where it came from: {"job", "hardware", "by", "at"}
    tensor_count = models.PositiveIntegerField(null=True, blank=True,
                                               help_text="tensors the checkpoint declares (every load must verify all)")
    has_chat_template = models.BooleanField(null=True, blank=True,
                                            help_text="the tokenizer has a chat template (serve must answer chat)")
    # where the reference host reads the weights (a path or a hub id): its reference run holds the references
    reference_source = models.CharField(max_length=500, blank=True,
                                        help_text="weights source the reference hardware reads for the reference run")
    # a quantised release's unquantised original: its eval is the baseline of the cell's "quality cost" row
    quantized_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="quantized_variants",
                                       help_text="the unquantised release this one is a quantisation of")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = [models.F("released_at").desc(nulls_last=True), "slug"]

    @property
    def takes_images(self) -> bool:
        return "image" in (self.modalities or [])

    def __str__(self) -> str:
        return self.slug


class Hardware(models.Model):
    """An accelerator pool: one device's memory, devices per node, bandwidths, dtypes, peak TFLOP/s per dtype
    and the names of operators its library implements natively.

    ``organization`` owns the pool: its admins edit it and mint its agent tokens, and its embargoed models may
    run on it. None is a shared catalog entry (the seeded public accelerators): staff edit it and operate its
    agents."""

    slug = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    organization = models.ForeignKey(
        "accounts.Organization", null=True, blank=True, on_delete=models.PROTECT, related_name="hardware",
        help_text="the owning organization; empty for a shared catalog entry operated by staff",
    )
    vendor = models.CharField(max_length=64, db_index=True)
    name = models.CharField(max_length=200)
    memory_bytes = models.BigIntegerField(help_text="memory per device, bytes")
    devices_per_node = models.PositiveIntegerField()
    intra_node_gbps = models.FloatField(null=True, blank=True)
    inter_node_gbps = models.FloatField(null=True, blank=True)
    memory_bandwidth_gbps = models.FloatField(null=True, blank=True)
    shared_memory = models.BooleanField(default=False, help_text="devices share one memory (a CPU host)")
    reference = models.BooleanField(
        default=False, help_text="staff-operated hardware whose reference runs compute the references the portal "
                                 "holds for each release (set by staff only)")
    notes = models.TextField(blank=True)
    dtypes = models.JSONField(default=list)
    peak_tflops = models.JSONField(default=dict, blank=True)
    operator_manifest = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["vendor", "slug"]
        verbose_name_plural = "hardware"

    def __str__(self) -> str:
        return self.slug

    @property
    def memory_gb(self) -> float:
        return self.memory_bytes / 1e9


class Engine(models.Model):
    """A serving engine at one version: how it is obtained (a package pin or an image digest), its launch command
    template (placeholders ``contract.engines.PLACEHOLDERS``) and what its endpoint can answer. ``day0`` is the
    bundled runtime (the default); ``openai-compatible`` takes the submitter's command (an empty template)."""

    name = models.CharField(max_length=64, validators=[slug_validator])
    version = models.CharField(max_length=64, blank=True, help_text="empty: any version (the generic engine)")
    obtained_by = models.CharField(max_length=300, blank=True,
                                   help_text="a package pin (vllm==0.32.0) or an image digest (repo@sha256:…)")
    executable = models.CharField(max_length=100, blank=True,
                                  help_text="the program an agent must find on its PATH (or be given) to run it")
    command = models.TextField(blank=True, help_text="the launch command template; empty: the job gives it")
    capabilities = models.JSONField(default=dict, blank=True,
                                    help_text="{logprobs, prompt_logprobs, images, tools, structured_output}: bools")
    default = models.BooleanField(default=False, help_text="the engine a job that names none runs")
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "version"]
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="uniq_engine_name_version")]

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name

    def __str__(self) -> str:
        return self.ref
