from __future__ import annotations

from datetime import datetime
from typing import Any

import django_filters
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.access import Actor, actor_username
from apps.accounts.api.mixins import get_actor, get_or_404, require
from apps.accounts.choices import Role, Scope
from apps.accounts.models import Organization
from apps.catalog import services
from apps.catalog.api.serializers import HardwareSerializer, ModelReleaseListSerializer, ModelReleaseSerializer
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import all_hardware, has_trusted_manifest, visible_models
from apps.core.validators import as_utc


class UTCIsoDateTimeField(django_filters.fields.IsoDateTimeField):
    """An ISO 8601 filter value converted to UTC (PostgreSQL refuses offsets beyond ±15:59)."""

    def to_python(self, value: object) -> datetime | None:
        parsed = super().to_python(value)
        try:
            return as_utc(parsed) if parsed is not None else None
        except ValueError as exc:
            raise DjangoValidationError(str(exc), code="invalid") from None


class UTCIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCIsoDateTimeField


class ModelReleaseFilter(django_filters.FilterSet):
    organization = django_filters.CharFilter(field_name="organization__slug")
    released_after = UTCIsoDateTimeFilter(field_name="released_at", lookup_expr="gte")
    released_before = UTCIsoDateTimeFilter(field_name="released_at", lookup_expr="lte")

    class Meta:
        model = ModelRelease
        fields = ["family", "architecture", "visibility", "organization"]


class ModelReleaseViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                          mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Model releases. Parameter counts, architecture and context length are computed from ``config``."""

    lookup_field = "slug"
    lookup_value_regex = r"[-a-zA-Z0-9_.]+"
    filterset_class = ModelReleaseFilter
    search_fields = ["slug", "name", "hf_repo"]
    ordering_fields = ["released_at", "params_total", "params_active", "name", "slug", "created_at"]

    def get_queryset(self) -> QuerySet[ModelRelease]:
        return visible_models(get_actor(self.request))

    def get_serializer_class(self) -> type[ModelReleaseSerializer]:
        return ModelReleaseListSerializer if self.action == "list" else ModelReleaseSerializer

    def get_object(self) -> ModelRelease:
        return get_or_404(self.get_queryset(), "model", slug=self.kwargs["slug"])

    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = get_actor(request)
        require(actor.has_scope(Scope.SUBMIT), actor, "creating a model needs the submit scope")
        services.check_slug_free(ModelRelease, request.data.get("slug") if isinstance(request.data, dict) else None)
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer: ModelReleaseSerializer) -> None:
        actor = get_actor(self.request)
        org_slug = self.request.data.get("organization") if isinstance(self.request.data, dict) else None
        if org_slug:
            org = Organization.objects.filter(slug=org_slug).first()
            if org is None:
                raise ValidationError({"organization": f"no organization with slug {org_slug!r}"})
            org_id = org.pk
        else:
            org_id = actor.default_org_id()
            if org_id is None:
                if not actor.authenticated:
                    raise PermissionDenied("creating a model needs the submit scope")
                raise ValidationError({"organization": "is required: you belong to several organizations"})
        if not actor.has_scope(Scope.SUBMIT, org_id):
            raise PermissionDenied("creating a model needs the submit scope in its organization")
        data = dict(serializer.validated_data)
        serializer.instance = services.do_create_model_release(organization_id=org_id, **data)

    def update(self, request: Request, *args, **kwargs) -> Response:
        model = self.get_object()
        actor = get_actor(request)
        require(actor.has_scope(Scope.SUBMIT, model.organization_id), actor,
                "changing a model needs the submit scope in its organization")
        serializer = ModelReleaseSerializer(model, data=request.data, partial=kwargs.get("partial", False))
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        if "manifest" in data:
            data.update(_manifest_provenance(actor, model, data["manifest"]))
        # a changed manifest re-judges the release's stored results (do_update_model_release: rejudge_results)
        model = services.check_update_model_release(actor, model, **data)
        return Response(ModelReleaseSerializer(model).data)


class HardwareViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                      mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Accelerators. Creating or editing one recomputes the fits estimates of its column."""

    lookup_field = "slug"
    lookup_value_regex = r"[-a-zA-Z0-9_.]+"
    serializer_class = HardwareSerializer
    filterset_fields = ["vendor"]
    search_fields = ["slug", "name", "vendor"]
    ordering_fields = ["slug", "vendor", "memory_bytes", "devices_per_node"]

    def get_queryset(self) -> QuerySet[Hardware]:
        return all_hardware()

    def get_object(self) -> Hardware:
        return get_or_404(self.get_queryset(), "hardware", slug=self.kwargs["slug"])

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            actor = get_actor(request)
            require(actor.is_catalog_admin(), actor, "editing hardware needs an organization admin or staff")

    def create(self, request: Request, *args, **kwargs) -> Response:
        """An organization admin's new hardware is that organization's (``organization`` defaults to the one
        organization the creator administers); staff may create shared entries with ``"organization": null``."""
        actor = get_actor(request)
        services.check_slug_free(Hardware, request.data.get("slug") if isinstance(request.data, dict) else None)
        serializer = HardwareSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        organization = data.pop("organization") if "organization" in data else _default_owner(actor)
        hardware = services.check_create_hardware(actor, organization=organization, **data)
        return Response(HardwareSerializer(hardware).data, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer: HardwareSerializer) -> None:
        serializer.instance = services.check_update_hardware(get_actor(self.request), serializer.instance,
                                                             **serializer.validated_data)


def _manifest_provenance(actor: Actor, model: ModelRelease, manifest: list) -> dict[str, Any]:
    """Who gives a manifest through a PATCH: staff ("staff"), or the release's organization while the release has
    none that loads are compared with ("given"); replacing or clearing such a manifest needs staff (403)."""
    if actor.is_staff:
        return {"manifest_source": "staff" if manifest else "",
                "manifest_seen": {"by": actor_username(actor), "at": timezone.now().isoformat()} if manifest else {}}
    if has_trusted_manifest(model) and manifest != model.manifest:
        raise PermissionDenied(f"{model.slug} has a manifest ({model.manifest_source}) that loads are compared "
                               "with; only staff change it")
    if has_trusted_manifest(model):  # the same manifest again: where it came from does not change
        return {"manifest_source": model.manifest_source, "manifest_seen": model.manifest_seen}
    return {"manifest_source": "given" if manifest else "", "manifest_seen": {}}


def _default_owner(actor: Actor) -> Organization | None:
    """The organization new hardware belongs to when the request names none: the token's, or the one the user
    administers; None (a shared entry) for staff who administer none."""
    if actor.token is not None:
        return Organization.objects.filter(pk=actor.token.organization_id).first()
    administered = sorted(org for org, role in actor.roles.items() if role == Role.ADMIN)
    if len(administered) > 1:
        raise ValidationError({"organization": "is required: you administer several organizations"})
    return Organization.objects.filter(pk=administered[0]).first() if administered else None
