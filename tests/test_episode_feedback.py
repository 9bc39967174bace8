"""Feedback on episodes through the REST API: checked, recorded on the episode, logged as an edit."""

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone

from memory.models import Episode


@pytest.fixture
def episode(service, user_factory):
    ada = user_factory("ada")
    return service.record_episode(
        started_at=timezone.now(), agent_id="bot", user_id=ada.pk, summary="booked a table", success=True
    )


def test_staff_give_feedback_and_a_rating_and_the_edit_is_logged(api, episode):
    url = f"/api/v1/episodes/{episode.pk}/feedback/"
    response = api.post(url, {"feedback": "  Booked the wrong day  ", "rating": 2}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["human_feedback"], body["human_rating"], body["id"]) == ("Booked the wrong day", 2, episode.pk)
    stored = Episode.objects.get(pk=episode.pk)
    assert (stored.human_feedback, stored.human_rating) == ("Booked the wrong day", 2)
    entry = LogEntry.objects.get(object_id=str(episode.pk), content_type__model="episode")
    assert "feedback" in entry.change_message and entry.object_repr == f"episode #{episode.pk}"

    # A rating alone keeps the comment; null clears the rating.
    assert api.post(url, {"rating": 5}, format="json").json()["human_feedback"] == "Booked the wrong day"
    cleared = api.post(url, {"rating": None}, format="json").json()
    assert cleared["human_rating"] is None and cleared["human_feedback"] == "Booked the wrong day"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"rating": 6}, "rating"),
        ({"rating": 0}, "rating"),
        ({"rating": "5"}, "rating"),
        ({"rating": True}, "rating"),
        ({"feedback": 12}, "feedback"),
        ({"feedback": "bad\x00byte"}, "feedback"),
        ({"feedback": "x" * 10_001}, "feedback"),
        ({}, "feedback"),
    ],
)
def test_bad_feedback_names_the_field_and_changes_nothing(api, episode, body, field):
    response = api.post(f"/api/v1/episodes/{episode.pk}/feedback/", body, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()
    stored = Episode.objects.get(pk=episode.pk)
    assert (stored.human_feedback, stored.human_rating) == ("", None)
    assert not LogEntry.objects.exists()


def test_feedback_on_a_missing_episode_is_a_404(api, episode):
    assert api.post("/api/v1/episodes/999999/feedback/", {"rating": 3}, format="json").status_code == 404


def test_feedback_is_staff_only(client, episode):
    response = client.post(f"/api/v1/episodes/{episode.pk}/feedback/", {"rating": 3}, content_type="application/json")
    assert response.status_code in (401, 403)
    assert Episode.objects.get(pk=episode.pk).human_rating is None
