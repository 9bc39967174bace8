"""Storage backends: the few database-specific parts of the memory, chosen by settings."""

import threading

from django.db import connection

from ..conf import memory_settings, on_memory_settings_changed

_lock = threading.Lock()
_backend = None


def get_backend():
    """The backend for the default database, built once per process."""
    global _backend
    if _backend is None:
        with _lock:
            if _backend is None:
                _backend = memory_settings.backend_class(connection.vendor)()
    return _backend


def reset_backend():
    global _backend
    _backend = None


on_memory_settings_changed(reset_backend)
