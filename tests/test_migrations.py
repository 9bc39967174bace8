"""Migrations that move data: a store written by an earlier release reads the same after upgrading."""

import datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from memory.models import Fact, FactHistory, FactVersion

BEFORE = ("memory", "0016_fact_search_pending_list")


def migrate(target=None):
    """Migrate to `target`, or to the latest migrations (where the other tests expect the schema)."""
    executor = MigrationExecutor(connection)
    targets = [target] if target else executor.loader.graph.leaf_nodes()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_0017_moves_each_facts_latest_version_onto_its_row():
    """Before 0017 every change was a version row, the current state included; after it, the fact's
    row is its current version, and its history reads exactly as before."""
    apps = migrate(BEFORE)
    try:
        OldFact, OldVersion = apps.get_model("memory", "Fact"), apps.get_model("memory", "FactVersion")
        t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        t = [t0 + datetime.timedelta(hours=h) for h in range(4)]
        city = OldFact.objects.create(key="city", value="Lisbon", scope="global", provenance="moved", confidence=0.9)
        tea = OldFact.objects.create(key="tea", value="oolong", scope="global", provenance="told")  # no history
        OldFact.objects.filter(pk=city.pk).update(updated_at=t[2])
        common = {"key": "city", "scope": "global", "scope_key": "global", "fact_type": "world_knowledge"}
        OldVersion.objects.create(
            fact_id=city.pk,
            action="created",
            value="Porto",
            confidence=0.5,
            provenance="told",
            valid_from=t[0],
            **common,
        )
        OldVersion.objects.create(
            fact_id=city.pk,
            action="updated",
            value="Lisbon",
            confidence=0.9,
            provenance="moved",
            valid_from=t[1],
            **common,
        )
        OldVersion.objects.create(  # a confirmation by another writer: the fact's current state
            fact_id=city.pk, action="confirmed", value="Lisbon", confidence=0.95, provenance="again", valid_from=t[2],
            source_episode_id=None, **common,
        )  # fmt: skip
        OldVersion.objects.create(  # a fact deleted long ago keeps its history untouched
            fact_id=999, action="deleted", value="x", confidence=0.5, provenance="", valid_from=t[3], **common
        )
    finally:
        migrate()
    assert FactVersion.objects.count() == 3  # Porto, the first Lisbon, the old delete
    current = Fact.objects.get(pk=city.pk)
    assert (current.change_action, current.change_provenance, current.updated_at) == ("confirmed", "again", t[2])
    history = [(v.action, v.value, v.provenance, v.current) for v in FactHistory.objects.filter(fact_id=city.pk)]
    assert history == [
        ("created", "Porto", "told", False),
        ("updated", "Lisbon", "moved", False),
        ("confirmed", "Lisbon", "again", True),
    ]
    [untouched] = FactHistory.objects.filter(fact_id=tea.pk)
    assert (untouched.action, untouched.provenance, untouched.current) == ("created", "told", True)
