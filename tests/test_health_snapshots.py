"""Daily health snapshots per agent: `memory health --snapshot`, kept HEALTH["SNAPSHOT_DAYS"] days, charted in /memories/."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from memory.exceptions import InvalidMemoryArgument
from memory.models import HealthSnapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def memory(service, user_factory):
    ada = user_factory("ada")
    service.set_fact("timezone", "UTC", scope="agent", agent_id="planner")
    service.set_fact("drink", "tea", scope="user", user_id=ada.pk)
    service.record_episode(started_at=timezone.now(), agent_id="support", user_id=ada.pk, summary="hi", success=True)
    return ada


def snapshot_json():
    out = io.StringIO()
    call_command("memory", "health", "--snapshot", "--json", stdout=out)
    return json.loads(out.getvalue())["snapshots"]


def test_a_snapshot_a_day_of_the_whole_memory_and_of_each_agent(service, memory):
    taken = snapshot_json()
    assert [row["agent_id"] for row in taken] == ["", "planner", "support"]
    whole = service.memory_health()
    assert taken[0]["band"] == whole.band and taken[0]["score"] == round(whole.score, 1)
    assert taken[1]["score"] == round(service.memory_health(agent_id="planner").score, 1)
    # The same day again replaces that day's snapshots.
    snapshot_json()
    assert HealthSnapshot.objects.count() == 3
    stored = HealthSnapshot.objects.get(agent_id="planner")
    assert set(stored.metrics) == {"freshness", "coverage", "coherence", "efficiency", "reachability"}


def test_snapshots_older_than_the_setting_go_with_the_next(service, memory, settings):
    settings.MEMORY = {**settings.MEMORY, "HEALTH": {**settings.MEMORY.get("HEALTH", {}), "SNAPSHOT_DAYS": 7}}
    today = timezone.now().date()
    for age in (3, 7, 8, 30):
        HealthSnapshot.objects.create(
            agent_id="planner", day=today - timedelta(days=age), score=50, band="yellow", taken_at=timezone.now()
        )
    service.snapshot_health()
    kept = sorted((today - s.day).days for s in HealthSnapshot.objects.filter(agent_id="planner"))
    assert kept == [0, 3, 7]
    assert [s.day for s in service.health_snapshots(agent_id="planner", days=5)] == [
        today - timedelta(days=3),
        today,
    ]
    with pytest.raises(InvalidMemoryArgument) as caught:
        service.health_snapshots(agent_id="planner", days=0)
    assert caught.value.field == "days"


def test_snapshot_takes_every_agent_at_once(memory):
    with pytest.raises(CommandError, match="--agent"):
        call_command("memory", "health", "--snapshot", "--agent", "planner", stdout=io.StringIO())
    assert not HealthSnapshot.objects.exists()


def test_the_health_tab_charts_each_agents_score(staff_client, service, memory):
    today = timezone.now().date()
    for age, score in ((2, 40.0), (1, 60.0)):
        HealthSnapshot.objects.create(
            agent_id="planner", day=today - timedelta(days=age), score=score, band="yellow", taken_at=timezone.now()
        )
    service.snapshot_health()
    page = staff_client.get("/memories/memory/healthsnapshot/").content.decode()
    assert page.count('<svg class="health-chart"') == 3  # all agents, planner, support
    assert "<figcaption>planner</figcaption>" in page and "<polyline" in page
    assert 'id="tab-health"' in page
    assert (
        staff_client.get(f"/memories/memory/healthsnapshot/{HealthSnapshot.objects.first().pk}/change/").status_code
        == 200
    )
