"""Settings of the memory app: the MEMORY dict in Django settings, read with defaults."""
from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

DEFAULTS = {
    # Dotted path of the storage backend; None picks the one for the database vendor.
    "BACKEND": None,
    # Confidence of a fact written without one.
    "DEFAULT_CONFIDENCE": 0.8,
    # Re-asserting the same value moves confidence this share of the way to 1.
    "CONFIRM_WEIGHT": 0.2,
    # A contradiction that is not written lowers confidence by this share.
    "CONTRADICT_WEIGHT": 0.2,
    "SEARCH_LIMIT": 10,
    "SEARCH_MIN_CONFIDENCE": 0.0,
    "RECENT_EPISODES": 5,
    "CONTEXT_FACTS": 50,
    # Access counts are buffered in memory and written in one statement when this many facts are
    # pending, at the end of each request, at exit, or on MemoryService.flush_access_counts().
    "ACCESS_FLUSH_PENDING": 5000,
    # Operators' REST API: most ids one batch-delete request may name, the largest request body
    # accepted (bytes), and the page size of list endpoints (a client may ask for up to MAX).
    "API_MAX_BATCH_IDS": 1000,
    "API_MAX_BODY_BYTES": 256 * 1024,
    "API_PAGE_SIZE": 50,
    "API_MAX_PAGE_SIZE": 500,
}

BACKENDS_BY_VENDOR = {
    "sqlite": "memory.backends.sqlite.SQLiteBackend",
    "postgresql": "memory.backends.postgresql.PostgreSQLBackend",
}


class MemorySettings:
    """Attribute access to MEMORY settings with defaults, like DRF's api_settings."""

    def __init__(self, defaults):
        self._defaults = defaults
        self._cache = {}

    def __getattr__(self, name):
        if name not in self._defaults:
            raise AttributeError(f"Unknown MEMORY setting: {name!r}")
        if name not in self._cache:
            user = getattr(settings, "MEMORY", {}) or {}
            self._cache[name] = user.get(name, self._defaults[name])
        return self._cache[name]

    def reload(self):
        self._cache.clear()

    def backend_class(self, vendor):
        path = self.BACKEND or BACKENDS_BY_VENDOR.get(vendor)
        if path is None:
            raise LookupError(f"No memory backend for database vendor {vendor!r}; set MEMORY['BACKEND'].")
        return import_string(path)


memory_settings = MemorySettings(DEFAULTS)


def _reload(*, setting, **kwargs):
    if setting == "MEMORY":
        memory_settings.reload()
        from .backends import reset_backend

        reset_backend()


setting_changed.connect(_reload)
