"""System checks of the memory app (`manage.py check`, and every server start)."""

from django.conf import settings
from django.core.checks import Error, Tags, register


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
