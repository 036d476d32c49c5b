from __future__ import annotations

from apps.alerts.api.views import DeliveryViewSet, SubscriptionViewSet

routes = [("alert-subscriptions", SubscriptionViewSet, "alert-subscription"),
          ("alert-deliveries", DeliveryViewSet, "alert-delivery")]
urlpatterns: list = []
