"""Compaction: an agent's old episodes folded into one summary episode, the originals archived and out of
recall, recall finding what the summary holds (memory/learning/compaction.py)."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from memory.exceptions import InvalidMemoryArgument
from memory.models import ArchivedEpisode, DeletionRecord, Episode, Fact, RecallEvent, RecallKind

TOPICS = ["dentist appointment moved", "invoice for march paid", "flight to lisbon booked", "gym membership", "tax"]


def old_runs(service, user, *, days_ago=100, agent="helper", topics=TOPICS, session=""):
    made = []
    for n, topic in enumerate(topics):
        made.append(
            service.record_episode(
                started_at=timezone.now() - timedelta(days=days_ago, hours=len(topics) - n),
                agent_id=agent,
                user_id=user.pk if user else None,
                session_id=session,
                conversation=[
                    {"role": "user", "content": f"about the {topic}"},
                    {"role": "assistant", "content": "ok"},
                ],
                success=n != 1,
            )
        )
    return made


def test_old_episodes_are_folded_into_one_summary_that_recall_finds(service, user_factory, keyword_only):
    ada = user_factory("ada")
    originals = old_runs(service, ada)
    recent = old_runs(service, ada, days_ago=1, topics=["recent chat about lisbon"])
    fact = service.set_fact("trip", "lisbon", scope="user", user_id=ada.pk, source_episode_id=originals[2].pk).fact
    before = service.recall("dentist appointment", agent_id="helper", user_id=ada.pk, types=["episodes"])
    assert [h.id for h in before] == [originals[0].pk]
    service.flush_recall_log()
    assert RecallEvent.objects.filter(kind=RecallKind.EPISODE, item_id=originals[0].pk).exists()

    report = service.compact_episodes()
    assert report.ok and report.archived == 5
    summary = Episode.objects.get(pk=report.groups[0]["summary_id"])
    assert (summary.agent_id, summary.user_id, summary.trigger_type) == ("helper", ada.pk, "compaction")
    assert summary.started_at == originals[0].started_at
    lines = summary.summary.splitlines()
    assert len(lines) == 5 and "dentist appointment moved" in lines[0] and "(failed)" in lines[1]
    assert summary.final_output == {
        "compacted": 5,
        "episode_ids": [e.pk for e in originals],
        "succeeded": 4,
        "failed": 1,
    }
    # The originals left the episode table (and recall), kept in the archive as they were.
    assert set(Episode.objects.values_list("pk", flat=True)) == {summary.pk, recent[0].pk}
    archived = ArchivedEpisode.objects.order_by("started_at")
    assert [a.episode_id for a in archived] == [e.pk for e in originals]
    assert all(a.summary_episode_id == summary.pk and a.user_id == ada.pk for a in archived)
    assert archived[0].record["conversation"][0]["content"] == "about the dentist appointment moved"
    after = service.recall("dentist appointment", agent_id="helper", user_id=ada.pk, types=["episodes"])
    assert [h.id for h in after] == [summary.pk]
    fact.refresh_from_db()
    assert fact.source_episode_id is None  # the fact stays
    record = DeletionRecord.objects.get()
    assert (record.actor, record.count) == ("compaction", 5)
    service.flush_recall_log()
    gone = [e.pk for e in originals]
    assert not RecallEvent.objects.filter(kind=RecallKind.EPISODE, item_id__in=gone).exists()

    # A summary is not compacted again; nothing old is left to fold.
    assert service.compact_episodes(older_than_days=0, min_episodes=2).groups == []


def test_groups_keep_their_owners_and_small_groups_wait(service, user_factory, keyword_only):
    ada, bob = user_factory("ada"), user_factory("bob")
    old_runs(service, ada)
    old_runs(service, bob, topics=TOPICS[:3])  # fewer than MIN_EPISODES (5)
    old_runs(service, ada, agent="other")
    report = service.compact_episodes()
    assert sorted((g["agent_id"], g["user_id"]) for g in report.groups) == [("helper", ada.pk), ("other", ada.pk)]
    assert Episode.objects.filter(user=bob).count() == 3
    # Bob does not see Ada's summary; Ada's agent "other" sees only its own.
    bobs = set(Episode.objects.filter(user=bob).values_list("pk", flat=True))
    assert {h.id for h in service.recall("dentist", agent_id="helper", user_id=bob.pk, types=["episodes"])} <= bobs
    hits = service.recall("dentist", agent_id="other", user_id=ada.pk, types=["episodes"])
    assert [h.id for h in hits] == [report.groups[1]["summary_id"]]


def test_a_persons_archive_is_in_their_export_and_footprint_and_goes_when_they_are_forgotten(service, user_factory):
    ada = user_factory("ada")
    originals = old_runs(service, ada)
    summary_id = service.compact_episodes().groups[0]["summary_id"]
    out = io.StringIO()
    service.export_person(ada.pk, out)
    archived = [json.loads(line) for line in out.getvalue().splitlines() if '"archived_episode"' in line]
    assert [a["id"] for a in archived] == [e.pk for e in originals]
    assert archived[0]["summary_episode"] == summary_id
    assert archived[0]["conversation"][0]["content"] == "about the dentist appointment moved"
    assert service.user_footprint([ada.pk])["archived_episodes"] == 5
    service.delete_users([ada.pk], cascade=True)
    assert not ArchivedEpisode.objects.exists() and not Episode.objects.exists()


def test_a_dry_run_writes_nothing_and_bad_arguments_are_refused(service, user_factory):
    old_runs(service, user_factory("ada"))
    report = service.compact_episodes(dry_run=True)
    assert report.archived == 5 and report.groups[0]["summary_id"] is None
    assert Episode.objects.count() == 5 and not ArchivedEpisode.objects.exists()
    for kwargs, field in (({"older_than_days": -1}, "older_than_days"), ({"min_episodes": 1}, "min_episodes")):
        with pytest.raises(InvalidMemoryArgument) as caught:
            service.compact_episodes(**kwargs)
        assert caught.value.field == field


def test_memory_compact_command(service, user_factory, capsys):
    ada = user_factory("ada")
    old_runs(service, ada)
    call_command("memory", "compact", "--dry-run")
    assert "would fold 5 episodes" in capsys.readouterr().out
    call_command("memory", "compact", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["archived"] == 5 and len(data["summaries"]) == 1
    assert not Fact.objects.exists()
