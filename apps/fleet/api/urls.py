from __future__ import annotations

from apps.fleet.api.views import AgentViewSet

routes = [("agents", AgentViewSet, "agent")]
urlpatterns: list = []
