"""App configuration of the memory app."""

from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "memory"
    verbose_name = "Memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.core.signals import request_finished, request_started
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate

        from . import checks  # noqa: F401  (system checks: SQLite's write mode)
        from .backends import sqlite  # noqa: F401  (registers SQL functions the SQLite index needs)
        from .backends.wal import prepare_connection
        from .embedding.embedder import log_mode
        from .models.workspaces import ensure_default_workspace
        from .recall.upkeep import flush_buffers, start_indexer

        connection_created.connect(prepare_connection, dispatch_uid="memory_sqlite_connections")
        request_finished.connect(flush_buffers, dispatch_uid="memory_flush_buffers")
        request_started.connect(start_indexer, dispatch_uid="memory_start_indexer")
        # `flush` (and a transactional test's teardown) empties every table, then emits post_migrate.
        post_migrate.connect(ensure_default_workspace, sender=self, dispatch_uid="memory_default_workspace")

        log_mode()  # recall: hybrid or keyword-only, said once at start
