from __future__ import annotations

from apps.catalog.api.engines import EngineViewSet
from apps.catalog.api.views import HardwareViewSet, ModelReleaseViewSet

routes = [("models", ModelReleaseViewSet, "model"), ("hardware", HardwareViewSet, "hardware"),
          ("engines", EngineViewSet, "engine")]
urlpatterns: list = []
