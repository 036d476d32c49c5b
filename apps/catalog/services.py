"""Writes to the catalog. Every create/update of a model or hardware refreshes the affected matrix cells
(their fits estimate) in the same transaction."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from agents.runtime.params import count_params
from agents.runtime.spec import SpecError, parse_config
from apps.accounts.access import Actor
from apps.accounts.models import Organization
from apps.catalog.models import Hardware, ModelRelease

# Fields derived from config.json; clients cannot set them.
DERIVED_MODEL_FIELDS: tuple[str, ...] = ("architecture", "family", "params_total", "params_active",
                                         "context_length", "dtype")
HARDWARE_FIELDS: tuple[str, ...] = ("slug", "vendor", "name", "memory_bytes", "devices_per_node", "intra_node_gbps",
                                    "inter_node_gbps", "memory_bandwidth_gbps", "dtypes", "peak_tflops",
                                    "operator_manifest", "shared_memory", "notes")


# Upper bounds on the sizes a config may declare: far above any real model, low enough that counting and
# planning stay fast and every count fits a 64-bit column.
CONFIG_LIMITS: dict[str, int] = {
    "num_hidden_layers": 4096, "n_layer": 4096, "hidden_size": 1 << 20, "intermediate_size": 1 << 24,
    "moe_intermediate_size": 1 << 24, "vocab_size": 1 << 24, "num_attention_heads": 1 << 14,
    "num_key_value_heads": 1 << 14, "head_dim": 1 << 14, "num_local_experts": 1 << 16, "num_experts": 1 << 16,
    "n_routed_experts": 1 << 16, "n_shared_experts": 1 << 10, "max_position_embeddings": 1 << 30,
    "kv_lora_rank": 1 << 16, "q_lora_rank": 1 << 16,
}


def _check_limits(config: dict[str, Any]) -> None:
    sections = [config] + [v for k, v in config.items() if k.endswith("_config") and isinstance(v, dict)]
    for section in sections:
        for key, limit in CONFIG_LIMITS.items():
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > limit:
                raise ValidationError({"config": f"config key '{key}' is {value}, above the limit {limit}"})


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
    except (TypeError, ValueError, KeyError, ZeroDivisionError) as exc:
        raise ValidationError({"config": f"config cannot be parsed: {exc}"}) from exc
    return {
        "architecture": spec.architecture,
        "family": spec.family,
        "params_total": counts.total,
        "params_active": counts.active,
        "context_length": spec.context_length,
        "dtype": spec.torch_dtype or "bfloat16",
    }


def _refresh_model_cells(model: ModelRelease) -> None:
    from apps.matrix.services import refresh_cells

    refresh_cells(models=[model])


@transaction.atomic
def do_create_model_release(*, config: dict[str, Any], **fields: Any) -> ModelRelease:
    """Creates a model from its config (derived fields computed here) and its matrix row."""
    model = ModelRelease(config=config, **fields, **model_fields_from_config(config))
    model.full_clean()
    model.save()
    _refresh_model_cells(model)
    return model


@transaction.atomic
def do_update_model_release(model: ModelRelease, **fields: Any) -> ModelRelease:
    """Updates a model; a new config recomputes the derived fields and the fits of its cells."""
    config_changed = "config" in fields and fields["config"] != model.config
    release_changed = "released_at" in fields and fields["released_at"] != model.released_at
    for name, value in fields.items():
        setattr(model, name, value)
    if config_changed:
        for name, value in model_fields_from_config(model.config).items():
            setattr(model, name, value)
    model.full_clean()
    model.save()
    if release_changed:
        from apps.matrix.services import refresh_lead_times

        refresh_lead_times(model)
    if config_changed:
        _refresh_model_cells(model)
    else:  # visibility or release date may change what the matrix shows; cells themselves are unchanged
        from apps.matrix.events import broadcast_matrix_changed

        transaction.on_commit(lambda: broadcast_matrix_changed(model_id=model.pk))
    return model


@transaction.atomic
def do_create_hardware(**fields: Any) -> Hardware:
    hardware = Hardware(**fields)
    hardware.full_clean()
    hardware.save()
    from apps.matrix.services import refresh_cells

    refresh_cells(hardware=[hardware])
    return hardware


@transaction.atomic
def do_update_hardware(hardware: Hardware, **fields: Any) -> Hardware:
    for name, value in fields.items():
        setattr(hardware, name, value)
    hardware.full_clean()
    hardware.save()
    from apps.matrix.services import refresh_cells

    refresh_cells(hardware=[hardware])
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
