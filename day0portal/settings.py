"""Django settings, read only from ``DAY0_*`` environment variables (see docker/.env.example).

Production sets ``DAY0_DATABASE_URL`` (PostgreSQL), ``DAY0_REDIS_URL`` (cache and channel layer) and
``DAY0_BROKER_URL`` (RabbitMQ, the Celery broker agents reach with users of their own). Without them the
embedded default runs the same code: SQLite and a filesystem Celery broker under ``DAY0_DATA_DIR`` and an
in-memory channel layer."""

from __future__ import annotations

import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from day0portal.env import env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("DAY0_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """DAY0_SECRET_KEY, else a random key generated once and kept in the data folder (embedded default)."""
    key = env_str("DAY0_SECRET_KEY")
    if key:
        return key
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DAY0_DEBUG", False)
ALLOWED_HOSTS = env_list("DAY0_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DAY0_CSRF_TRUSTED_ORIGINS", [])
SESSION_COOKIE_SECURE = env_bool("DAY0_SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "channels",
    "apps.core",
    "apps.accounts",
    "apps.catalog",
    "apps.fleet",
    "apps.jobs",
    "apps.evidence",
    "apps.matrix",
    "apps.benchmarks",
    "apps.dashboards",
    "apps.alerts",
    "apps.references",
    "apps.ops",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "apps.core.middleware.BodySizeLimitMiddleware",
    "apps.core.middleware.RejectNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "apps.ops.middleware.RefusedResultsMiddleware",
    "apps.ops.tracing.TraceMiddleware",
]

ROOT_URLCONF = "day0portal.urls"
WSGI_APPLICATION = "day0portal.wsgi.application"
ASGI_APPLICATION = "day0portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------------------
DATABASE_URL = env_str("DAY0_DATABASE_URL")
if DATABASE_URL:
    try:
        _db = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DAY0_DB_CONN_MAX_AGE", 60, minimum=0))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DAY0_DATABASE_URL is not a database URL: {exc}") from exc
    # Under ASGI every request and WebSocket consumer runs its database calls on a thread of its own, and a
    # persistent connection stays with its thread: 200 open sockets held ~200 connections per worker and
    # PostgreSQL refused the rest ("too many clients"). A bounded pool per process (psycopg_pool) caps them;
    # DAY0_DB_POOL_MAX_SIZE=0 keeps per-thread persistent connections (DAY0_DB_CONN_MAX_AGE) instead.
    _pool_max = env_int("DAY0_DB_POOL_MAX_SIZE", 16, minimum=0)
    if _pool_max and "postgresql" in _db["ENGINE"]:
        _db["CONN_MAX_AGE"] = 0  # the pool keeps the connections; Django requires 0 with a pool
        _db.setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": _pool_max,
                                                 "timeout": env_int("DAY0_DB_POOL_TIMEOUT", 30, minimum=1)}
else:
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(DATA_DIR / "day0.sqlite3"),
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
    }
_db.setdefault("TEST", {})
if env_str("DAY0_TEST_DATABASE_NAME"):
    _db["TEST"]["NAME"] = env_str("DAY0_TEST_DATABASE_NAME")
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- broker, channel layer, cache -----------------------------------------------------------------------
# Two trust domains (docs/portal.md, "Trust boundaries"): DAY0_REDIS_URL (the cache and the channel layer) is
# the portal's alone; DAY0_BROKER_URL is where jobs are queued, and in production each agent reaches it with a
# broker user of its own that reads its own queues only (``manage.py broker_user``). Without DAY0_BROKER_URL
# the Redis of DAY0_REDIS_URL is the broker too (development and the test suite); without either, the kombu
# filesystem broker and an in-memory channel layer (the embedded default).
REDIS_URL = env_str("DAY0_REDIS_URL")
BROKER_URL = env_str("DAY0_BROKER_URL") or REDIS_URL
BROKER_DIR = DATA_DIR / "broker"
if BROKER_URL:
    CELERY_BROKER_URL = BROKER_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
else:
    # kombu's filesystem transport: a real broker with no server; producers and workers share the folder.
    for _sub in ("queue", "processed", "control"):
        (BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),  # exchange tables; kombu's default is ./control
        "store_processed": False,
        "polling_interval": 0.25,  # kombu's 1 s default made a worker take ~5 s to stop and jobs wait to start
    }
# Where ``manage.py broker_user`` manages RabbitMQ users: the management API (http://admin:pass@host:15672),
# else ``rabbitmqctl`` on this host.
BROKER_ADMIN_URL = env_str("DAY0_BROKER_ADMIN_URL")
# the bearer token Prometheus presents to /metrics (staff sessions see it too); empty: staff only
METRICS_TOKEN = env_str("DAY0_METRICS_TOKEN")
# OpenTelemetry traces: DAY0_TRACING_EXPORTER, read by telemetry.tracing in every process (off when empty)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default, the layer's blocking pop waits 5 s: under
            # load the reply lost that race, the consumer died and its WebSocket dropped without a close frame
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                       "prefix": env_str("DAY0_CHANNELS_PREFIX", "day0")},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Django's cache: Redis with DAY0_REDIS_URL (shared by the portal processes behind a load balancer), else memory
# per process. Entries are keyed by the data they summarize (newest row ids, counts, edit times), so new
# evidence makes a new key rather than waiting for an expiry. Values are JSON, never pickle
# (``day0portal.cache``): a value read from Redis cannot run code.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                      "KEY_PREFIX": env_str("DAY0_CACHE_PREFIX", "day0"),
                      "OPTIONS": {"socket_connect_timeout": 5, "socket_timeout": 5,
                                  "serializer": "day0portal.cache.JSONSerializer"}}} if REDIS_URL else {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]  # a message is data: nothing on the broker is unpickled
CELERY_RESULT_BACKEND = None  # job state lives in the database, never only in a result backend
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = env_str("DAY0_CELERY_DEFAULT_QUEUE", "portal")
CELERY_TASK_ALWAYS_EAGER = env_bool("DAY0_CELERY_EAGER", False)

# --- auth, i18n, static ---------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("DAY0_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
WHITENOISE_USE_FINDERS = True  # serve straight from static/ when collectstatic has not run (demo, tests)
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns when it is missing

# Requests larger than this are refused with 413 (JSON bodies, result documents, event batches).
MAX_BODY_BYTES = env_int("DAY0_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_BODY_BYTES
EVENT_BATCH_MAX = env_int("DAY0_EVENT_BATCH_MAX", 5000, minimum=1)

# --- REST API -------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["apps.core.api.parsers.StrictJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "apps.core.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "apps.core.api.exceptions.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Day-0 Portal API",
    "DESCRIPTION": "Model x hardware compatibility matrix, adaptation jobs and their evidence.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",  # operations grouped by resource (jobs, models, …), not all under "v1"
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "day0portal.api_schema.add_summaries_and_enums"],
}
# Swagger UI served from this process, not a CDN (works offline).
INSTALLED_APPS.append("drf_spectacular_sidecar")
SPECTACULAR_SETTINGS.update(SWAGGER_UI_DIST="SIDECAR", SWAGGER_UI_FAVICON_HREF="SIDECAR", REDOC_DIST="SIDECAR")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # the job, trace and request ids appended when known (telemetry.tracing)
    "formatters": {"plain": {"()": "telemetry.tracing.ContextFormatter",
                             "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("DAY0_LOG_LEVEL", "INFO").upper()},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
