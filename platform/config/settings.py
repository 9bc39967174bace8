"""Settings of the Engram site, read from the environment with embedded defaults."""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent  # platform/
DATA_DIR = Path(os.environ.get("ENGRAM_DATA_DIR", BASE_DIR / "data"))
DATA_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name, default=False):
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = env_bool("DEBUG", False)
# The embedded default key is only good for a local, DEBUG-less demo; set SECRET_KEY in production.
SECRET_KEY = os.environ.get("SECRET_KEY", "engram-insecure-development-key-change-me")
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h.strip()
]

INSTALLED_APPS = [
    # Engram's apps first: their admin/base_site.html (the /memories/ tabs) comes before Django's.
    "memory",
    "workflows",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
]

# WhiteNoise is sync-only, and it is last on purpose. Under ASGI, Django runs every middleware above
# a sync-only one in sync mode, in the request's one thread; Django's own middleware run in async mode
# instead hop to that thread and back for each of their methods (about a dozen hops per request).
# With WhiteNoise innermost the whole stack costs one switch: bench.webhook --server asgi went from
# 46.4 to 50.7 updates/s (medians of 3, interleaved; bench/README.md). Under WSGI the order changes
# nothing but that static files pass the other middleware first (cheap: sessions and users load lazily).
# Django's ModelBackend, loading a session's user with their workspace in one query (memory/api/workspaces.py).
AUTHENTICATION_BACKENDS = ["memory.api.workspaces.WorkspaceModelBackend"]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # No workspace leaks from one request into the next (the API and the admin choose one per request).
    "memory.api.workspaces.WorkspaceMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
]

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],  # the apps' own templates/ (APP_DIRS)
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

WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"


def database_from_env():
    """SQLite in DATA_DIR (WAL, busy timeout, IMMEDIATE writes) unless DATABASE_URL is set."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        db = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
        if db["ENGINE"] == "django.db.backends.sqlite3":
            db.update(OPTIONS=sqlite_options())
        return db
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "db.sqlite3",
        "OPTIONS": sqlite_options(),
        # Kept open between requests: a new connection costs its PRAGMAs and per-connection setup.
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        # A file, not :memory:, so tests see WAL and the busy timeout across threads as the site does.
        "TEST": {"NAME": str(DATA_DIR / f"test-{os.getpid()}.sqlite3")},
    }


def sqlite_options():
    return {
        # Writers take the lock at BEGIN, so read-then-write transactions never fail to upgrade.
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        # Every statement here runs on each new connection, so none may need the write lock (a new
        # connection would wait for every writer): auto_vacuum, which pruning needs, is set once per
        # file by migration 0004, not here.
        "init_command": (
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; "
            "PRAGMA cache_size=-65536;"  # 64 MiB of page cache per connection
        ),
    }


DATABASES = {"default": database_from_env()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# WhiteNoise serves the admin's static files from the apps themselves: no collectstatic step needed.
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "memories:login"

# The operators' REST API (memory/api/, /api/v1/) carries its own policy (memory/api/policy.py: staff
# only, by token "Authorization: Token <key>" from `manage.py drf_create_token <username>`, or by the
# admin's session with its CSRF token), so it needs no REST_FRAMEWORK settings but drf-spectacular's one.
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}

# OpenAPI 3 schema at /api/schema/, Swagger UI at /api/docs/ (assets served locally), staff only.
SPECTACULAR_SETTINGS = {
    "TITLE": "Engram API",
    "DESCRIPTION": "What agents remember: list, inspect and delete facts, episodes, procedures, memory users "
    "and conversation checkpoints. Staff only.",
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",  # tags by kind: facts, episodes, ...
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAdminUser"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "memory.api.schema.add_error_responses",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},  # stderr
    "loggers": {
        "engram": {"handlers": ["console"], "level": os.environ.get("ENGRAM_LOG_LEVEL", "INFO")},
        # Every unhandled exception of a request, with its path and traceback, whatever DEBUG says
        # (Django's default sends them only to ADMINS by mail when DEBUG is off: nowhere, here).
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

# Engram's own settings: one namespaced dict per app, read through memory.conf.memory_settings.
MEMORY = {}
# ENGRAM_EMBEDDINGS=none: keyword-only recall even with the local model installed (or a dotted path).
if "ENGRAM_EMBEDDINGS" in os.environ:
    _embeddings = os.environ["ENGRAM_EMBEDDINGS"].strip()
    MEMORY["EMBEDDINGS"] = None if _embeddings.lower() in ("", "none", "off") else _embeddings

# ENGRAM_TASK_BROKER=redis://host:6379/0 (or amqp://...): background work on Celery workers
# (docs/guides/several-machines.md). Unset: the embedded default, no broker and no extra process.
MEMORY["TASK_BROKER"] = os.environ.get("ENGRAM_TASK_BROKER", "").strip()
CELERY_BROKER_URL = MEMORY["TASK_BROKER"] or "memory://"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The queue every task goes to and the workers read (several sites on one broker: one name each).
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("ENGRAM_TASK_QUEUE", "engram")
CELERY_TASK_IGNORE_RESULT = True
# A task is acknowledged when it ends, so one whose worker was killed runs again elsewhere: every task
# is safe to repeat (claims and once-per-period rows in the database decide who does the work).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_HIJACK_ROOT_LOGGER = False


def chat_model_from_env():
    """An OpenAI-compatible chat model when ENGRAM_CHAT_MODEL is set; None: the offline responder."""
    model = os.environ.get("ENGRAM_CHAT_MODEL", "").strip()
    if not model:
        return None
    return {
        "base_url": os.environ.get("ENGRAM_CHAT_BASE_URL", "").strip() or None,
        "api_key": os.environ.get("ENGRAM_CHAT_API_KEY", ""),
        "model": model,
    }


# Read through workflows.conf.workflow_settings; see the README for every key and its default.
WORKFLOWS = {
    "CHECKPOINT_PATH": DATA_DIR / "checkpoints.db",
    "CHAT_MODEL": chat_model_from_env(),
    "TELEGRAM_API_BASE": os.environ.get("TELEGRAM_API_BASE", "https://api.telegram.org"),
    "TELEGRAM_BOT_TOKEN": os.environ.get("TELEGRAM_BOT_TOKEN", ""),
    "TELEGRAM_WEBHOOK_SECRET": os.environ.get("TELEGRAM_WEBHOOK_SECRET", ""),
}
