"""System checks of the memory app (`manage.py check`, and every server start)."""

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register(Tags.database, Tags.compatibility)
def sqlite_writes_take_the_lock_at_begin(app_configs, **kwargs):
    """A SQLite database must start write transactions IMMEDIATE.

    The fact upserts read, then insert or update, inside one transaction; two such transactions
    started DEFERRED both read, and the second to write fails with "database is locked" (SQLite
    cannot upgrade its read lock while another writer waits) instead of queueing behind the first.
    """
    errors = []
    for alias, db in settings.DATABASES.items():
        if "sqlite" not in db.get("ENGINE", ""):
            continue
        mode = (db.get("OPTIONS") or {}).get("transaction_mode")
        if str(mode).upper() != "IMMEDIATE":
            errors.append(
                Error(
                    f"DATABASES[{alias!r}] is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE' "
                    f"(it is {mode!r}): concurrent memory writes would fail with 'database is locked'.",
                    hint="Add 'transaction_mode': 'IMMEDIATE' to that database's OPTIONS (Django 5.1+).",
                    id="memory.E001",
                )
            )
    return errors


@register(Tags.compatibility)
def host_project_settings(app_configs, **kwargs):
    """What a project that adds Engram's apps must also have (README: "Add Engram to an existing
    Django project"): the apps Engram's API and admin use, its API schema class, and its apps listed
    before django.contrib.admin (their admin/base_site.html gives /memories/ its tabs)."""
    errors = []
    apps = list(settings.INSTALLED_APPS)
    needed = ["rest_framework", "rest_framework.authtoken", "django_filters", "drf_spectacular"]
    missing = [app for app in needed if app not in apps]
    if missing:
        errors.append(
            Error(
                f"INSTALLED_APPS lacks {', '.join(missing)}, which Engram's API needs.",
                hint="Add them to INSTALLED_APPS.",
                id="memory.E002",
            )
        )
    schema = getattr(settings, "REST_FRAMEWORK", {}).get("DEFAULT_SCHEMA_CLASS", "")
    if not str(schema).startswith("drf_spectacular."):
        errors.append(
            Error(
                "REST_FRAMEWORK['DEFAULT_SCHEMA_CLASS'] is not drf-spectacular's: /api/schema/ would fail.",
                hint="Set REST_FRAMEWORK = {'DEFAULT_SCHEMA_CLASS': 'drf_spectacular.openapi.AutoSchema'}.",
                id="memory.E003",
            )
        )
    spectacular = getattr(settings, "SPECTACULAR_SETTINGS", {})
    if "drf_spectacular_sidecar" not in apps or spectacular.get("SWAGGER_UI_DIST") != "SIDECAR":
        errors.append(
            Warning(
                "/api/docs/ loads Swagger UI from a CDN: drf_spectacular_sidecar is not in INSTALLED_APPS, "
                "or SPECTACULAR_SETTINGS['SWAGGER_UI_DIST'] is not 'SIDECAR'.",
                hint="Add 'drf_spectacular_sidecar' to INSTALLED_APPS and the SIDECAR settings of the README.",
                id="memory.W002",
            )
        )
    if "memory.api.schema.add_error_responses" not in spectacular.get("POSTPROCESSING_HOOKS", ()):
        errors.append(
            Warning(
                "/api/schema/ documents only the 200 answers: SPECTACULAR_SETTINGS['POSTPROCESSING_HOOKS'] "
                "lacks 'memory.api.schema.add_error_responses'.",
                hint="Set POSTPROCESSING_HOOKS to drf-spectacular's enum hook and Engram's, as the README shows.",
                id="memory.W003",
            )
        )
    if "memory.api.workspaces.WorkspaceMiddleware" not in settings.MIDDLEWARE:
        errors.append(
            Warning(
                "MIDDLEWARE lacks 'memory.api.workspaces.WorkspaceMiddleware': the workspace one request "
                "works in may stay current for the next request its thread serves.",
                hint="Add it to MIDDLEWARE (docs: Workspaces).",
                id="memory.W004",
            )
        )
    if "django.contrib.admin" in apps and apps.index("memory") > apps.index("django.contrib.admin"):
        errors.append(
            Warning(
                "'memory' comes after 'django.contrib.admin' in INSTALLED_APPS: /memories/ loses its tabs.",
                hint="List 'memory' and 'workflows' before 'django.contrib.admin'.",
                id="memory.W001",
            )
        )
    return errors
