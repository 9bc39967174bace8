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
        pet = OldFact.objects.create(key="pet", value="dog", scope="global", provenance="said")
        OldFact.objects.filter(pk=city.pk).update(updated_at=t[2])
        OldFact.objects.filter(pk=pet.pk).update(updated_at=t[3])  # written again while history was off
        common = {"key": "city", "scope": "global", "scope_key": "global", "fact_type": "world_knowledge"}
        for fact_id, action, value, confidence, provenance, when in [
            (city.pk, "created", "Porto", 0.5, "told", t[0]),
            (city.pk, "updated", "Lisbon", 0.9, "moved", t[1]),
            (city.pk, "confirmed", "Lisbon", 0.95, "again", t[2]),  # by another writer: the current state
            (999, "deleted", "x", 0.5, "", t[3]),  # a fact deleted long ago keeps its history untouched
            (pet.pk, "created", "cat", 0.5, "said", t[0]),  # older than its row: not its current state
        ]:
            OldVersion.objects.create(
                fact_id=fact_id, action=action, value=value, confidence=confidence, provenance=provenance,
                valid_from=when, **common,
            )  # fmt: skip
    finally:
        migrate()
    assert FactVersion.objects.count() == 4  # Porto, the first Lisbon, the old delete, the cat
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
    assert [(v.action, v.value, v.current) for v in FactHistory.objects.filter(fact_id=pet.pk)] == [
        ("created", "cat", False),
        ("created", "dog", True),  # what history did not see: the row as it stands, by its own writer
    ]


@pytest.mark.django_db(transaction=True)
def test_0019_dates_every_episode_document_and_back():
    """0019 rewrites the documents of episodes written before it with their date first (and clears
    their vectors, for the worker to embed again); going back restores the undated text."""

    def texts():
        return {d.item_id: (d.text, d.embedding is None) for d in RecallDocument.objects.filter(kind="episode")}

    apps = migrate(("memory", "0018_fact_owner_search_index"))
    try:
        # The models of that state: the documents' later columns (a workspace) are not there yet.
        RecallDocument = apps.get_model("memory", "RecallDocument")
        Episode = apps.get_model("memory", "Episode")
        old = Episode.objects.create(agent_id="bot", conversation=[{"role": "user", "content": "I like tea."}])
        Episode.objects.filter(pk=old.pk).update(started_at=datetime.datetime(2023, 5, 8, 23, 30, tzinfo=datetime.UTC))
        RecallDocument.objects.filter(kind="episode", item_id=old.pk).update(embedding=b"\0" * 16)
        [(undated, cleared)] = texts().values()
        assert not cleared
        migrate(("memory", "0019_episode_date_in_recall_text"))
        assert texts() == {old.pk: ("8 May 2023\nuser: I like tea.", True)}  # 23:30 UTC: the UTC date
        migrate(("memory", "0018_fact_owner_search_index"))
        assert texts() == {old.pk: (undated, True)}
        assert undated.strip() == "user: I like tea."
    finally:
        migrate()


@pytest.mark.django_db(transaction=True)
def test_0029_keeps_facts_their_indexes_and_ids_and_goes_back():
    """0029 rebuilds memory_fact (a new generated owner key): the facts keep their ids and owners,
    the search and recall indexes keep following writes, a deleted fact's id is not handed out again,
    and going back leaves the facts of the scopes before it."""
    from memory.models import RecallDocument
    from memory.service import MemoryService

    apps = migrate(("memory", "0028_store_search_index"))
    try:
        OldFact = apps.get_model("memory", "Fact")
        kept = OldFact.objects.create(
            key="office", value="Porto", scope="agent", agent_id="bot", search_text="office porto"
        )
        gone = OldFact.objects.create(key="tmp", value="x", scope="global", search_text="tmp x")
        gone_id = gone.pk
        gone.delete()
        team_apps = migrate(("memory", "0029_team_scope"))
        assert team_apps.get_model("memory", "Fact").objects.get(pk=kept.pk).scope_key == "agent:bot"
        migrate()  # the service reads the latest schema (0030 adds workspaces on top)
        service = MemoryService()
        assert service.get_fact("office", agent_id="bot").value == "Porto"
        service.create_team("ops", agent_ids=["bot"])
        new = service.set_fact("rota", "weekly", scope="team", team="ops").fact
        assert new.pk > gone_id
        assert [f.key for f in service.search_facts("weekly", agent_id="bot")] == ["rota"]
        Fact.objects.filter(pk=kept.pk).update(search_text="office lisbon")  # the update triggers still run
        assert RecallDocument.objects.get(kind="fact", item_id=kept.pk).text.endswith("office lisbon")
        migrate(("memory", "0028_store_search_index"))
        assert list(OldFact.objects.values_list("pk", flat=True)) == [kept.pk]  # the team's fact could not stay
    finally:
        migrate()


@pytest.mark.django_db(transaction=True)
def test_0031_makes_unique_keys_per_workspace_and_goes_back():
    """0031 lets each workspace hold the same fact, person, procedure, store item and team; the rows,
    their ids and the search and recall triggers stay; going back makes the keys unique over every
    workspace again."""
    from django.db import IntegrityError, transaction

    def recall_text(fact_id):  # the live model has columns later migrations add
        with connection.cursor() as cursor:
            cursor.execute("SELECT text FROM memory_recall_doc WHERE kind = 'fact' AND item_id = %s", [fact_id])
            return cursor.fetchone()[0]

    apps = migrate(("memory", "0030_workspaces"))
    try:
        Workspace, OldFact = apps.get_model("memory", "Workspace"), apps.get_model("memory", "Fact")
        other = Workspace.objects.create(slug="other")
        kept = OldFact.objects.create(key="tone", value="warm", scope="agent", agent_id="bot", search_text="tone warm")
        with pytest.raises(IntegrityError), transaction.atomic():  # before 0031: one fact over all workspaces
            OldFact.objects.create(
                key="tone", value="dry", scope="agent", agent_id="bot", search_text="tone dry", workspace=other
            )
        new_apps = migrate(("memory", "0031_workspace_unique_keys"))
        rows = {
            "Fact": {"key": "tone", "value": "dry", "scope": "agent", "agent_id": "bot", "search_text": "tone dry"},
            "MemoryUser": {"canonical_id": "telegram:42"},
            "Procedure": {"agent_id": "bot", "name": "refund"},
            "StoreItem": {"namespace": "docs", "key": "note", "value": {}, "scope": "global", "created_at": NOW,
                          "updated_at": NOW},
            "Team": {"name": "ops"},
        }  # fmt: skip
        made = []
        for name, fields in rows.items():
            model = new_apps.get_model("memory", name)
            if name != "Fact":  # the default workspace holds `kept`, the same fact
                model.objects.create(**fields)
            made.append(model.objects.create(**fields, workspace_id=other.pk))
            with pytest.raises(IntegrityError), transaction.atomic():  # still one per workspace
                model.objects.create(**fields, workspace_id=other.pk)
        user = new_apps.get_model("memory", "MemoryUser").objects.get(workspace_id=other.pk)
        identity = new_apps.get_model("memory", "ChannelIdentity")
        identity.objects.create(user=user, channel="telegram", external_id="42", workspace_id=other.pk)
        identity.objects.create(user=user, channel="telegram", external_id="42", workspace_id=DEFAULT_WORKSPACE)
        assert new_apps.get_model("memory", "Fact").objects.get(pk=kept.pk).scope_key == "agent:bot"
        new_apps.get_model("memory", "Fact").objects.filter(pk=kept.pk).update(search_text="tone hot")
        assert recall_text(kept.pk).endswith("tone hot")
        # Going back needs the keys unique over every workspace again.
        identity.objects.all().delete()
        for row in made:
            type(row).objects.filter(pk=row.pk).delete()
        migrate(("memory", "0030_workspaces"))
        assert list(OldFact.objects.values_list("pk", flat=True)) == [kept.pk]
        with pytest.raises(IntegrityError), transaction.atomic():
            OldFact.objects.create(
                key="tone", value="dry", scope="agent", agent_id="bot", search_text="tone dry", workspace=other
            )
        OldFact.objects.filter(pk=kept.pk).update(search_text="tone cold")
        assert recall_text(kept.pk).endswith("tone cold")
    finally:
        migrate()


NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DEFAULT_WORKSPACE = 1


@pytest.mark.django_db(transaction=True)
def test_0032_and_0033_give_versions_and_recall_documents_their_workspace_and_go_back():
    """0032: each fact version takes its fact's workspace (a deleted fact's: its person's, team's or
    episode's, else the default one) and the history view shows it; 0033: each recall document
    takes its item's, and the item triggers write it from then on. Both go back, and forwards again."""
    from memory.models import RecallDocument
    from memory.service import MemoryService

    def documents():
        with connection.cursor() as cursor:
            cursor.execute("SELECT kind, item_id FROM memory_recall_doc ORDER BY kind, item_id")
            return cursor.fetchall()

    apps = migrate(("memory", "0031_workspace_unique_keys"))
    try:
        Workspace = apps.get_model("memory", "Workspace")
        OldFact, OldVersion = apps.get_model("memory", "Fact"), apps.get_model("memory", "FactVersion")
        b = Workspace.objects.create(slug="b").pk
        person = apps.get_model("memory", "MemoryUser").objects.create(display_name="P", workspace_id=b)
        episode = apps.get_model("memory", "Episode").objects.create(agent_id="bot", workspace_id=b)
        procedure = apps.get_model("memory", "Procedure").objects.create(name="p", content="c", workspace_id=b)
        fact = OldFact.objects.create(
            key="k", value="v", scope="agent", agent_id="bot", search_text="k v", workspace_id=b
        )
        when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        common = {"key": "k", "value": "old", "confidence": 0.5, "valid_from": when, "action": "created"}
        agent = {"scope": "agent", "scope_key": "agent:bot", "agent_id": "bot"}
        of_fact = OldVersion.objects.create(fact_id=fact.pk, **agent, **common)
        of_person = OldVersion.objects.create(
            fact_id=900, scope="user", scope_key=f"user:{person.pk}", user_id=person.pk, **common
        )
        of_episode = OldVersion.objects.create(fact_id=901, source_episode_id=episode.pk, **agent, **common)
        of_nobody = OldVersion.objects.create(fact_id=902, **agent, **common)
        migrate()
        assert dict(FactVersion.objects.values_list("pk", "workspace_id")) == {
            of_fact.pk: b, of_person.pk: b, of_episode.pk: b, of_nobody.pk: 1,
        }  # fmt: skip
        assert FactHistory.objects.get(pk=-fact.pk).workspace_id == b
        assert set(RecallDocument.objects.values_list("kind", "item_id", "workspace_id")) == {
            ("fact", fact.pk, b), ("episode", episode.pk, b), ("procedure", procedure.pk, b),
        }  # fmt: skip
        from memory.models import Workspace as LiveWorkspace
        from memory.models import in_workspace

        with in_workspace(LiveWorkspace.objects.get(pk=b)):
            new = MemoryService().set_fact("n", "w", scope="global").fact
        assert RecallDocument.objects.get(kind="fact", item_id=new.pk).workspace_id == b
        migrate(("memory", "0031_workspace_unique_keys"))
        later = OldFact.objects.create(key="l", value="x", scope="global", search_text="l x", workspace_id=b)
        assert ("fact", later.pk) in documents()  # the triggers as they were
        assert OldVersion.objects.count() == 4
        migrate()
        assert RecallDocument.objects.get(kind="fact", item_id=later.pk).workspace_id == b
        assert FactVersion.objects.get(pk=of_nobody.pk).workspace_id == 1
    finally:
        migrate()
