"""Every portal model has a working Django admin page."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin

from tests.factories import JobFactory, UserFactory

pytestmark = pytest.mark.django_db

PORTAL_APPS = ("accounts", "catalog", "fleet", "jobs", "evidence", "matrix")


def test_every_portal_model_is_registered_and_its_list_renders(client) -> None:
    JobFactory()
    user = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(user)
    for label in PORTAL_APPS:
        for model in apps.get_app_config(label).get_models():
            assert admin.site.is_registered(model), model
            url = f"/admin/{label}/{model._meta.model_name}/"
            assert client.get(url).status_code == 200, url
