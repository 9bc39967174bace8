"""App configuration of the memory app."""

from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "memory"
    verbose_name = "Memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.backends.signals import connection_created

        from . import (
            checks,  # noqa: F401  (system checks: SQLite's write mode)
            signals,  # noqa: F401  (flushes buffered access counts)
        )
        from .backends import sqlite  # noqa: F401  (registers SQL functions the SQLite index needs)
        from .backends.wal import prepare_connection
        from .embedding.embedder import log_mode

        connection_created.connect(prepare_connection, dispatch_uid="memory_sqlite_connections")

        log_mode()  # recall: hybrid or keyword-only, said once at start
