"""Workflow definitions: validated against the node registry on save, compiled and run; the palette API."""

import copy

import pytest

from workflows.demo import DEMO_DEFINITION
from workflows.exceptions import InvalidDefinition
from workflows.graph.runtime import run_workflow
from workflows.models import Workflow


def definition(**changes):
    data = copy.deepcopy(DEMO_DEFINITION)
    data.update(changes)
    return data


def save(data):
    return Workflow.objects.create(slug="wf", name="wf", definition=data)


@pytest.mark.parametrize(
    "data, node, fragment",
    [
        (definition(nodes=[{"id": "x", "type": "teleport"}]), "x", "unknown node type 'teleport'"),
        (
            definition(
                nodes=[{"id": "recall", "type": "recall", "config": {"limit": 0}}],
                edges=[{"source": "START", "target": "recall"}],
            ),
            "recall",
            "config.limit: 0 is less than the minimum of 1",
        ),
        (
            definition(
                nodes=[{"id": "recall", "type": "recall", "config": {"colour": "red"}}],
                edges=[{"source": "START", "target": "recall"}],
            ),
            "recall",
            "'colour' was unexpected",
        ),
        (
            definition(edges=DEMO_DEFINITION["edges"] + [{"source": "agent", "target": "ghost"}]),
            "agent",
            "dangling edge to unknown node 'ghost'",
        ),
        (
            definition(edges=[e for e in DEMO_DEFINITION["edges"] if e["target"] != "remember"]),
            "remember",
            "not reachable from START",
        ),
        (
            definition(edges=DEMO_DEFINITION["edges"][:-1] + [{"source": "remember", "target": "recall"}]),
            "recall",
            "cycle without exit",
        ),
        (
            definition(
                nodes=DEMO_DEFINITION["nodes"] + [{"id": "agent2", "type": "agent", "config": {}}],
                edges=DEMO_DEFINITION["edges"] + [{"source": "recall", "target": "agent2"}],
            ),
            "agent2",
            "only one agent node per workflow may keep conversation memory",
        ),
    ],
)
def test_bad_definitions_are_refused_naming_the_node(db, data, node, fragment):
    with pytest.raises(InvalidDefinition) as caught:
        save(data)
    assert caught.value.node == node
    assert fragment in str(caught.value) and f'node "{node}"' in str(caught.value)
    assert not Workflow.objects.exists()


@pytest.mark.parametrize(
    "data, fragment",
    [
        ([], "must be a JSON object"),
        ({"nodes": []}, "non-empty list"),
        (definition(edges=[e for e in DEMO_DEFINITION["edges"] if e["source"] != "START"]), "no edge from START"),
        (
            definition(edges=DEMO_DEFINITION["edges"] + [{"source": "nowhere", "target": "agent"}]),
            "dangling edge from unknown node",
        ),
    ],
)
def test_malformed_definitions_are_refused(db, data, fragment):
    with pytest.raises(InvalidDefinition, match=fragment):
        save(data)


def test_a_cycle_with_a_conditional_exit_is_accepted_and_runs(db):
    # agent -> remember -> (back to recall while "retry" is set, else END): exits when the flag is unset.
    data = definition(
        edges=DEMO_DEFINITION["edges"][:-1]
        + [{"source": "remember", "target": "recall", "when": "retry"}, {"source": "remember", "target": "END"}]
    )
    workflow = save(data)
    result = run_workflow(workflow, {"type": "manual", "payload": {"user_name": "ada", "message": "hello"}})
    assert result.reply.startswith("[offline responder]")


def test_model_clean_reports_the_error_on_the_definition_field(db):
    from django.core.exceptions import ValidationError

    workflow = Workflow(slug="wf", name="wf", definition=definition(nodes=[{"id": "x", "type": "teleport"}]))
    with pytest.raises(ValidationError) as caught:
        workflow.full_clean()
    assert "definition" in caught.value.message_dict


def test_node_types_api_lists_the_palette_for_staff(admin_client, client, db):
    response = admin_client.get("/api/v1/node-types/")
    assert response.status_code == 200
    types = {t["name"]: t for t in response.json()}
    assert {"identify_user", "recall", "remember", "agent"} <= set(types)
    recall = types["recall"]
    assert recall["category"] == "memory" and recall["description"]
    assert recall["config_schema"]["properties"]["limit"]["minimum"] == 1
    assert "memory_prompt" in recall["outputs"] and "messages" in recall["inputs"]
    assert client.get("/api/v1/node-types/").status_code == 401  # anonymous: token auth answers first


def test_node_types_api_queries(admin_client, django_assert_max_num_queries, db):
    admin_client.get("/api/v1/node-types/")
    with django_assert_max_num_queries(2):  # the session and the user: the palette itself needs none
        assert admin_client.get("/api/v1/node-types/").status_code == 200
