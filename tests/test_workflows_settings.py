"""WORKFLOWS settings: the renamed TOP_UP_FACTS (formerly RECALL_CANDIDATES) and its old name's deprecation."""

import warnings

import pytest
from django.test import override_settings

from workflows.conf import workflow_settings
from workflows.graph.memory_access import RecallOptions, RecallScope, recall_for


@pytest.fixture
def ada(service, user_factory):
    """A person with five facts of their own."""
    ada = user_factory("ada")
    for n in range(5):
        service.set_fact(f"pet_{n}", f"cat number {n}", scope="user", user_id=ada.pk)
    return ada


def top_up(ada):
    """The facts a recall with no words to search for answers with: the person's own, as many as were
    read (no search runs, so the same holds keyword-only and hybrid)."""
    recalled = recall_for("", RecallScope(agent_id="bot", user_id=ada.pk), RecallOptions(limit=10))
    assert not any(f["matched"] for f in recalled.facts)
    return recalled.facts


@pytest.mark.django_db
def test_top_up_facts_bounds_the_own_facts_a_recall_reads(ada):
    assert workflow_settings.TOP_UP_FACTS == 200
    assert len(top_up(ada)) == 5
    with override_settings(WORKFLOWS={"TOP_UP_FACTS": 2}):
        assert len(top_up(ada)) == 2


@pytest.mark.django_db
def test_the_old_name_is_still_read_with_a_deprecation_warning(ada):
    with override_settings(WORKFLOWS={"RECALL_CANDIDATES": 3}):
        with pytest.warns(DeprecationWarning, match=r"WORKFLOWS\['RECALL_CANDIDATES'\].*WORKFLOWS\['TOP_UP_FACTS'\]"):
            assert len(top_up(ada)) == 3


@pytest.mark.django_db
def test_the_new_name_wins_over_the_old_and_warns_nothing(ada):
    with override_settings(WORKFLOWS={"TOP_UP_FACTS": 4, "RECALL_CANDIDATES": 1}):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            assert workflow_settings.TOP_UP_FACTS == 4
        assert len(top_up(ada)) == 4
