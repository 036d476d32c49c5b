"""``/api/v1/engines/``: the serving engines jobs may name (list, detail by ``NAME`` or ``NAME@VERSION``); staff
create one."""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import mixins, serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.api.mixins import get_actor, require
from apps.catalog.engines import ensure_builtin_engines, resolve_engine
from apps.catalog.models import Engine
from contract.engines import CAPABILITIES, check_template


class EngineSerializer(serializers.ModelSerializer):
    ref = serializers.CharField(read_only=True, help_text="NAME@VERSION (NAME for an engine without a version)")

    class Meta:
        model = Engine
        fields = ["id", "ref", "name", "version", "obtained_by", "executable", "command", "capabilities", "default",
                  "notes", "created_at"]
        read_only_fields = ["id", "ref", "default", "created_at"]

    def validate_command(self, value: str) -> str:
        try:
            check_template(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def validate_capabilities(self, value: object) -> dict:
        if not isinstance(value, dict) or any(k not in CAPABILITIES or not isinstance(v, bool)
                                              for k, v in value.items()):
            raise serializers.ValidationError(f"an object of booleans with keys among {', '.join(CAPABILITIES)}")
        return value


class EngineViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                    viewsets.GenericViewSet):
    """Serving engines: ``day0`` (the bundled runtime, the default) and external ones a job names with
    ``engine``."""

    serializer_class = EngineSerializer
    lookup_field = "ref"
    lookup_value_regex = r"[-a-zA-Z0-9_.+@]+"
    search_fields = ["name", "version"]

    def get_queryset(self) -> QuerySet[Engine]:
        if not Engine.objects.exists():
            ensure_builtin_engines()
        return Engine.objects.all()

    def get_object(self) -> Engine:
        from django.core.exceptions import ValidationError
        from django.http import Http404

        try:
            return resolve_engine(self.kwargs["ref"])
        except ValidationError as exc:
            raise Http404(" ".join(exc.messages)) from None

    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = get_actor(request)
        require(actor.is_staff, actor, "adding an engine needs staff")
        return super().create(request, *args, **kwargs)
