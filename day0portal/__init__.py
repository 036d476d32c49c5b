"""Day-0 Portal: the Django project (settings, URLs, ASGI routing, Celery app) and the `day0` command."""
