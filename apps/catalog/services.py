"""Writes to the catalog. Every create/update of a model or hardware refreshes the affected matrix cells
(their fits estimate) in the same transaction."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q

from apps.accounts.access import Actor
from apps.accounts.models import Organization
from apps.catalog.choices import DTYPE_NAMES
from apps.catalog.models import Hardware, ModelRelease
from apps.core import events
from apps.core.errors import ConflictError
from contract.model.params import count_params
from contract.model.spec import SpecError, config_takes_images, parse_config

# Fields derived from config.json; clients cannot set them.
DERIVED_MODEL_FIELDS: tuple[str, ...] = ("architecture", "family", "params_total", "params_active",
                                         "context_length", "dtype")
HARDWARE_FIELDS: tuple[str, ...] = ("slug", "vendor", "name", "memory_bytes", "devices_per_node", "intra_node_gbps",
                                    "inter_node_gbps", "memory_bandwidth_gbps", "dtypes", "peak_tflops",
                                    "operator_manifest", "shared_memory", "notes")


# Upper bounds on the counts a config may declare: far above any real model, low enough that counting and
# planning stay fast and every count fits a 64-bit column. Each must be a JSON integer (5000.0 and 1e6 are not).
CONFIG_LIMITS: dict[str, int] = {
    "num_hidden_layers": 4096, "n_layer": 4096, "num_layers": 4096, "hidden_size": 1 << 20, "n_embd": 1 << 20,
    "d_model": 1 << 20, "intermediate_size": 1 << 24, "moe_intermediate_size": 1 << 24, "vocab_size": 1 << 24,
    "num_attention_heads": 1 << 14, "n_head": 1 << 14, "num_key_value_heads": 1 << 14, "head_dim": 1 << 14,
    "num_local_experts": 1 << 16, "num_experts": 1 << 16, "n_routed_experts": 1 << 16, "n_shared_experts": 1 << 10,
    "num_experts_per_tok": 1 << 16, "experts_per_token": 1 << 16, "max_position_embeddings": 1 << 30,
    "n_positions": 1 << 30, "seq_length": 1 << 30, "kv_lora_rank": 1 << 16, "q_lora_rank": 1 << 16,
    "qk_nope_head_dim": 1 << 14, "qk_rope_head_dim": 1 << 14, "v_head_dim": 1 << 14, "first_k_dense_replace": 4096,
    "moe_layer_freq": 4096, "decoder_sparse_step": 4096, "num_nextn_predict_layers": 64, "n_group": 1 << 16,
    "topk_group": 1 << 16, "sliding_window": 1 << 30,
}
# The whole model, however its sizes combine: 10^15 parameters (the largest public models have ~10^12).
MAX_CONFIG_PARAMS = 10**15
CONFIG_OBJECT_KEYS: tuple[str, ...] = ("rope_scaling", "rope_parameters", "quantization_config", "text_config")
CONFIG_DTYPE_KEYS: tuple[str, ...] = ("torch_dtype", "dtype")


def _config_error(message: str) -> ValidationError:
    return ValidationError({"config": message})


def _check_section(section: dict[str, Any], where: str) -> None:
    for key, limit in CONFIG_LIMITS.items():
        value = section.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise _config_error(f"config key '{where}{key}' must be an integer from 0 to {limit}, got {value!r}")
        if not 0 <= value <= limit:
            raise _config_error(f"config key '{where}{key}' is {value}, outside the bounds 0..{limit}")
    for key in CONFIG_OBJECT_KEYS:
        value = section.get(key)
        if value is not None and not isinstance(value, dict):
            raise _config_error(f"config key '{where}{key}' must be an object or null, got {type(value).__name__}")
    for key in CONFIG_DTYPE_KEYS:
        value = section.get(key)
        if value is not None and not (isinstance(value, str) and value in DTYPE_NAMES):
            raise _config_error(f"config key '{where}{key}' must be a dtype name such as 'bfloat16' (one of "
                                f"{', '.join(sorted(DTYPE_NAMES))}), got {value!r}")
    for key in ("layer_types", "mlp_only_layers"):
        value = section.get(key)
        kind = str if key == "layer_types" else int
        if value is not None and not (isinstance(value, list) and len(value) <= CONFIG_LIMITS["num_hidden_layers"]
                                      and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)):
            raise _config_error(f"config key '{where}{key}' must be a list of at most "
                                f"{CONFIG_LIMITS['num_hidden_layers']} {kind.__name__}s")


def _check_limits(config: dict[str, Any]) -> None:
    """Refuses (400 naming the key and its bound) a config whose counts are not integers or out of bounds, whose
    dtype is not a dtype name, or whose object-valued keys hold something else."""
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and 0 < len(archs) <= 16
                                  and all(isinstance(a, str) and len(a) <= 100 for a in archs)):
        raise _config_error("config key 'architectures' must be a list of 1 to 16 class names")
    _check_section(config, "")
    for key, value in config.items():
        if key.endswith("_config") and isinstance(value, dict):
            _check_section(value, f"{key}.")


def model_fields_from_config(config: Any) -> dict[str, Any]:
    """Architecture, family, parameter counts, context length and dtype computed from a ``config.json``.

    Raises ``ValidationError({"config": ...})`` naming the missing or bad key."""
    if not isinstance(config, dict):
        raise ValidationError({"config": "config must be a JSON object (the model's config.json)"})
    _check_limits(config)
    try:
        spec = parse_config(config)
        counts = count_params(spec)
    except SpecError as exc:
        raise ValidationError({"config": str(exc)}) from exc
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError, OverflowError) as exc:
        raise ValidationError({"config": f"config cannot be parsed: {exc}"}) from exc
    if counts.total > MAX_CONFIG_PARAMS:
        raise ValidationError({"config": f"the config declares {counts.total:.3e} parameters, above the limit "
                                         f"{MAX_CONFIG_PARAMS:.0e}"})
    return {
        "architecture": spec.architecture,
        "family": spec.family,
        "params_total": counts.total,
        "params_active": counts.active,
        "context_length": spec.context_length,
        "dtype": spec.torch_dtype or "bfloat16",
    }


@transaction.atomic
def do_create_model_release(*, config: dict[str, Any], **fields: Any) -> ModelRelease:
    """Creates a model from its config (derived fields computed here) and its matrix row. A config with a
    vision tower records the release as taking images when no modalities are given."""
    if not fields.get("modalities") and config_takes_images(config):
        fields["modalities"] = ["text", "image"]
    model = ModelRelease(config=config, **fields, **model_fields_from_config(config))
    model.full_clean()
    model.save()
    events.send_now(events.catalog_changed, model=model, hardware=None, created=True, changed=[])  # its matrix row
    return model


@transaction.atomic
def do_update_model_release(model: ModelRelease, **fields: Any) -> ModelRelease:
    """Updates a model; a new config recomputes the derived fields. The ``catalog_changed`` event names the fields
    that changed: the matrix refreshes the fits of its cells (or its lead times), evidence judges its results
    again when a fact they were judged with changed (``evidence.rejudge``)."""
    changed = _changed_fields(model, fields)
    for name, value in fields.items():
        setattr(model, name, value)
    if "config" in changed:
        for name, value in model_fields_from_config(model.config).items():
            setattr(model, name, value)
    model.full_clean()
    model.save()
    events.send_now(events.catalog_changed, model=model, hardware=None, created=False, changed=changed)
    return model


def _changed_fields(row: ModelRelease | Hardware, fields: dict[str, Any]) -> list[str]:
    """The names of ``fields`` whose values differ from ``row``'s (read before the update is applied)."""
    return [name for name, value in fields.items() if value != getattr(row, name)]


@transaction.atomic
def do_create_hardware(**fields: Any) -> Hardware:
    hardware = Hardware(**fields)
    hardware.full_clean()
    hardware.save()
    events.send_now(events.catalog_changed, model=None, hardware=hardware, created=True, changed=[])  # its column
    return hardware


@transaction.atomic
def do_update_hardware(hardware: Hardware, **fields: Any) -> Hardware:
    """Updates a hardware; through the ``catalog_changed`` event the matrix refreshes the fits estimates of its
    column, and a change of its spec (memory, devices, bandwidths, dtypes …) judges the verdicts of its jobs
    again (``evidence.rejudge``)."""
    changed = _changed_fields(hardware, fields)
    for name, value in fields.items():
        setattr(hardware, name, value)
    hardware.full_clean()
    hardware.save()
    events.send_now(events.catalog_changed, model=None, hardware=hardware, created=False, changed=changed)
    return hardware


def check_create_hardware(actor: Actor, *, organization: Organization | None, **fields: Any) -> Hardware:
    """Any organization's admin creates hardware, owned by that organization (it decides who mints its agent
    tokens and which embargoed models run on it); staff also create shared catalog entries
    (``organization=None``)."""
    if not actor.is_catalog_admin():
        raise PermissionDenied("creating hardware needs an organization admin or staff")
    if organization is None and not (actor.is_staff and actor.token is None):
        raise PermissionDenied("only staff create shared hardware (no owning organization)")
    if organization is not None and not actor.administers_hardware(organization.pk):
        raise PermissionDenied(f"only admins of {organization.slug} or staff create hardware owned by it")
    return do_create_hardware(organization=organization, **fields)


def check_update_hardware(actor: Actor, hardware: Hardware, **fields: Any) -> Hardware:
    """Admins of the owning organization, or staff, edit a hardware (its fits estimates follow); a shared
    catalog entry is staff's only, and only staff give a hardware another owner."""
    owner = hardware.organization
    if not actor.administers_hardware(hardware.organization_id):
        if owner is None:
            raise PermissionDenied(f"hardware {hardware.slug} is a shared catalog entry: only staff edit it")
        raise PermissionDenied(f"hardware {hardware.slug} belongs to {owner.slug}: only admins of {owner.slug} "
                               "or staff edit it")
    if "organization" in fields and fields["organization"] != owner and not (actor.is_staff and actor.token is None):
        raise PermissionDenied(f"only staff move hardware {hardware.slug} to another organization")
    return do_update_hardware(hardware, **fields)


# --- ownership ---------------------------------------------------------------------------------------------

OWNED_RELEASE_FIELDS: tuple[str, ...] = ("visibility", "released_at")


def check_slug_free(kind: type[ModelRelease] | type[Hardware], slug: Any) -> None:
    """Creating a model or hardware whose slug exists is a 409 naming the organization that owns it (or that
    it is a shared catalog entry), never a quiet 400 from the unique field."""
    if not isinstance(slug, str) or not slug:
        return
    row = kind.objects.filter(slug=slug).select_related("organization").first()
    if row is None:
        return
    what = "model" if kind is ModelRelease else "hardware"
    owner = f"organization {row.organization.slug}" if row.organization else "the shared catalog (staff)"
    raise ConflictError(f"{what} slug {slug!r} exists: it belongs to {owner}")


def organizations_with_evidence(model: ModelRelease) -> list[str]:
    """The other organizations with evidence on ``model``: a stage result of a job requested by another
    organization, or of a job on hardware another organization owns (read through the release's jobs)."""
    own = model.organization_id
    with_results = model.jobs.filter(stage_results__isnull=False)
    by_job = (with_results.filter(organization__isnull=False).exclude(organization_id=own)
              .values_list("organization__slug", flat=True))
    by_hardware = (with_results.filter(~Q(hardware__organization_id=own), hardware__organization__isnull=False)
                   .values_list("hardware__organization__slug", flat=True))
    return sorted(set(by_job.distinct()[:50]) | set(by_hardware.distinct()[:50]))


def check_update_model_release(actor: Actor, model: ModelRelease, **fields: Any) -> ModelRelease:
    """Once another organization has evidence on a release, its visibility and release date change only by
    staff (a staff session): its owner could otherwise hide that evidence behind an embargo (403 naming the
    rule and the organizations)."""
    moving = [name for name in OWNED_RELEASE_FIELDS if name in fields and fields[name] != getattr(model, name)]
    if moving and not (actor.is_staff and actor.token is None):
        others = organizations_with_evidence(model)
        if others:
            raise PermissionDenied(
                f"{model.slug} has evidence from other organizations ({', '.join(others)}): its "
                f"{' and '.join(n.replace('_', ' ') for n in moving)} change only by staff")
    return do_update_model_release(model, **fields)
