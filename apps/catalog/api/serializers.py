from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from apps.accounts.models import Organization
from apps.catalog.choices import DTYPE_NAMES, Visibility
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.services import model_fields_from_config
from contract.hardware import MAX_MEMORY_BANDWIDTH_GBPS
from contract.manifest import check_manifest

# What the loads of a release say about its weights' digests, read from load evidence by the evidence app (it sits
# above catalog) and installed by it in ``EvidenceConfig.ready``: "digest_conflict" (model -> the disagreement
# between hardware, or None) and "hardware_digests" (model id -> each hardware's newest passing load's digests).
DIGEST_READERS: dict[str, Callable[[Any], Any]] = {}


class ModelReleaseSerializer(serializers.ModelSerializer):
    organization = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    config = serializers.JSONField(write_only=False)

    class Meta:
        model = ModelRelease
        fields = ["id", "slug", "name", "organization", "hf_repo", "architecture", "family", "params_total",
                  "params_active", "published_params_total", "published_params_active", "context_length", "dtype",
                  "modalities", "released_at", "visibility", "config", "manifest", "manifest_source", "manifest_seen",
                  "tensor_count", "has_chat_template", "digest_conflict", "hardware_digests", "reference_source",
                  "quantized_from", "created_at",
                  "updated_at"]
        read_only_fields = ["id", "architecture", "family", "params_total", "params_active", "context_length",
                            "dtype", "manifest_source", "manifest_seen", "digest_conflict", "created_at", "updated_at"]
        extra_kwargs = {
            "manifest": {"help_text": "the checksum manifest of the weight files, [{name, size, sha256}] (as "
                                      "`day0 manifest MODEL_DIR` prints it); every load is compared with it. Given by "
                                      "the creator (\"given\"; once the release has one, only staff change it: "
                                      "\"staff\"), or recorded by the release's reference run (\"reference\"); "
                                      "never taken from a vendor's load"},
            "tensor_count": {"min_value": 1, "max_value": 10_000_000},
        }

    manifest = serializers.JSONField(required=False)
    quantized_from = serializers.SlugRelatedField(
        slug_field="slug", queryset=ModelRelease.objects.all(), required=False, allow_null=True,
        help_text="the slug of the unquantised release this one quantises (public, or of the same organization): "
                  "its eval is the baseline of the cell's quality-cost row")
    digest_conflict = serializers.SerializerMethodField(
        help_text="while the release has no manifest loads are compared with: where two hardware loaded different "
                  "bytes ({file, hardware: [a, b], sha256: [x, y], jobs, files_differing, files, groups}); "
                  "staff settle it (POST manifest/settle/); {} when none")
    hardware_digests = serializers.SerializerMethodField(
        help_text="per hardware, its newest passing load's shard digests [{hardware, job, at, shards: {file: "
                  "sha256}}]: kept apart, never the release's manifest")

    def get_digest_conflict(self, model: ModelRelease) -> dict[str, Any]:
        return DIGEST_READERS["digest_conflict"](model) or {}

    def get_hardware_digests(self, model: ModelRelease) -> list[dict[str, Any]]:
        return DIGEST_READERS["hardware_digests"](model.pk)

    def validate_manifest(self, value: Any) -> list[dict[str, Any]]:
        try:
            return check_manifest(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "manifest" in attrs:  # a manifest given through the API is the release's own, not first seen
            attrs["manifest_source"] = "given" if attrs["manifest"] else ""
            attrs["manifest_seen"] = {}
        return attrs

    def validate_config(self, value: Any) -> dict[str, Any]:
        try:
            model_fields_from_config(value)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict["config"]) from exc
        return value

    def validate_reference_source(self, value: Any) -> str:
        value = (value or "").strip()
        if any(ord(c) < 32 for c in value):
            raise serializers.ValidationError("must be a path or a hub id the reference host can read (no control "
                                              "characters)")
        return value

    def validate_quantized_from(self, value: ModelRelease | None) -> ModelRelease | None:
        if value is None:
            return None
        own = getattr(self.instance, "organization_id", None) or getattr(self.context.get("organization"), "pk", None)
        if self.instance is not None and value.pk == self.instance.pk:
            raise serializers.ValidationError("a release cannot be a quantisation of itself")
        if value.visibility != Visibility.PUBLIC and value.organization_id != own:
            raise serializers.ValidationError(f"no release {value.slug!r} you may name here")
        if value.quantized_from_id is not None or (value.config or {}).get("quantization_config"):
            raise serializers.ValidationError(f"{value.slug!r} is itself quantised: name the unquantised original")
        return value

    def validate_modalities(self, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise serializers.ValidationError("must be a list of strings such as ['text', 'image']")
        return value


class ModelReleaseListSerializer(ModelReleaseSerializer):
    """The list omits the (large) config and manifest."""

    class Meta(ModelReleaseSerializer.Meta):
        fields = [f for f in ModelReleaseSerializer.Meta.fields
                  if f not in ("config", "manifest", "digest_conflict", "hardware_digests")]


class HardwareSerializer(serializers.ModelSerializer):
    memory_gb = serializers.FloatField(read_only=True)
    organization = serializers.SlugRelatedField(
        slug_field="slug", queryset=Organization.objects.all(), required=False, allow_null=True,
        error_messages={"does_not_exist": "no organization with slug {value!r}"},
        help_text="the owning organization (default: the one you administer); null is a shared entry (staff)",
    )

    class Meta:
        model = Hardware
        fields = ["id", "slug", "organization", "vendor", "name", "memory_bytes", "memory_gb", "devices_per_node", "intra_node_gbps",
                  "inter_node_gbps", "memory_bandwidth_gbps", "dtypes", "peak_tflops", "operator_manifest",
                  "shared_memory", "notes", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_memory_bytes(self, value: int) -> int:
        if value <= 0:
            raise serializers.ValidationError("must be positive (bytes of memory per device)")
        return value

    def validate_devices_per_node(self, value: int) -> int:
        if value < 1:
            raise serializers.ValidationError("must be at least 1")
        return value

    def validate_dtypes(self, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise serializers.ValidationError("must be a list of dtype names")
        unknown = sorted(set(value) - DTYPE_NAMES)
        if unknown:
            raise serializers.ValidationError(f"unknown dtypes {unknown}; known: {sorted(DTYPE_NAMES)}")
        return value

    def validate_peak_tflops(self, value: Any) -> dict[str, float]:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
            for k, v in value.items()
        ):
            raise serializers.ValidationError("must map dtype names to non-negative numbers")
        return value

    def validate_operator_manifest(self, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise serializers.ValidationError("must be a list of operator names")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for name in ("intra_node_gbps", "inter_node_gbps", "memory_bandwidth_gbps"):
            if (attrs.get(name) or 0) < 0:
                raise serializers.ValidationError({name: "must not be negative"})
        bandwidth = attrs.get("memory_bandwidth_gbps")
        if bandwidth is not None and not 0 < bandwidth <= MAX_MEMORY_BANDWIDTH_GBPS:
            raise serializers.ValidationError({"memory_bandwidth_gbps": (
                f"{bandwidth:g} GB/s is not a device's memory bandwidth: give one above 0 and at most "
                f"{MAX_MEMORY_BANDWIDTH_GBPS:g} GB/s (the bench's physics floor is read from it), or null")})
        return attrs
