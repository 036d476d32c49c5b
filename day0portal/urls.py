"""URL map: pages, admin, the versioned REST API, its schema and docs, health probes."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.core import views as core_views
from apps.ops import views as ops_views

urlpatterns = [
    path("", include("apps.dashboards.urls")),  # cell page, job console, trends, Day-0 timeline, badges, exports
    path("", include("apps.matrix.urls")),  # the matrix at /
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("day0portal.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("healthz", core_views.healthz, name="healthz"),
    path("readyz", core_views.readyz, name="readyz"),
    path("metrics", ops_views.metrics, name="metrics"),  # Prometheus: staff or DAY0_METRICS_TOKEN
]
