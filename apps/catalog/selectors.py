"""Read-side queries of the catalog, shared by pages and the API. Visibility is decided here only."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.accounts.access import Actor
from apps.catalog.choices import Visibility
from apps.catalog.models import Hardware, ModelRelease
from contract.manifest import LEGACY_SOURCES


def public_models_q(prefix: str = "") -> Q:
    """Public models, and private ones whose release time has passed (the embargo is over)."""
    return Q(**{f"{prefix}visibility": Visibility.PUBLIC}) | Q(**{f"{prefix}released_at__lte": timezone.now()})


def visible_models_q(actor: Actor, prefix: str = "") -> Q:
    """What ``actor`` may see: public models plus its organizations' private ones (staff see everything)."""
    if actor.is_staff:
        return Q()
    q = public_models_q(prefix)
    if actor.org_ids:
        q |= Q(**{f"{prefix}organization_id__in": sorted(actor.org_ids)})
    return q


def model_is_public(model: ModelRelease) -> bool:
    return model.visibility == Visibility.PUBLIC or (
        model.released_at is not None and model.released_at <= timezone.now()
    )


def visible_models(actor: Actor) -> QuerySet[ModelRelease]:
    return ModelRelease.objects.filter(visible_models_q(actor)).select_related("organization")


def all_hardware() -> QuerySet[Hardware]:
    return Hardware.objects.select_related("organization")


def has_trusted_manifest(model: ModelRelease) -> bool:
    """Whether the release has a manifest its loads are compared with (not one recorded under an older rule)."""
    return bool(model.manifest) and model.manifest_source not in LEGACY_SOURCES
