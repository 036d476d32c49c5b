from __future__ import annotations

from apps.accounts.api.views import ApiTokenViewSet, OrganizationViewSet

routes = [("tokens", ApiTokenViewSet, "token"), ("organizations", OrganizationViewSet, "organization")]
urlpatterns: list = []
