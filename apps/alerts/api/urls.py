from __future__ import annotations

from apps.alerts.api.views import DeliveryViewSet, StackPolicyViewSet, SubscriptionViewSet

routes = [("alert-subscriptions", SubscriptionViewSet, "alert-subscription"),
          ("alert-deliveries", DeliveryViewSet, "alert-delivery"),
          ("stack-policies", StackPolicyViewSet, "stack-policy")]
urlpatterns: list = []
