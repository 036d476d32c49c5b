from __future__ import annotations

from apps.accounts.api.views import ApiTokenViewSet, InvitationViewSet, OrganizationViewSet

routes = [("tokens", ApiTokenViewSet, "token"), ("organizations", OrganizationViewSet, "organization"),
          ("invitations", InvitationViewSet, "invitation")]
urlpatterns: list = []
