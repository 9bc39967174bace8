"""The demo workflow: Telegram (or any trigger) -> identify_user -> recall -> agent -> remember."""

DEMO_SLUG = "demo"

DEMO_DEFINITION = {
    "nodes": [
        {"id": "identify_user", "type": "identify_user", "config": {}},
        {"id": "recall", "type": "recall", "config": {"memory_types": ["all"], "limit": 10, "min_confidence": 0.5}},
        {
            "id": "agent",
            "type": "agent",
            "config": {
                "conversation_memory": True,
                "history_limit": 20,
                "tools": {"recall": {"memory_type": "all"}, "remember": {"fact_type": "world_knowledge"}},
            },
        },
        {"id": "remember", "type": "remember", "config": {"scope": "user"}},
    ],
    "edges": [
        {"source": "START", "target": "identify_user"},
        {"source": "identify_user", "target": "recall"},
        {"source": "recall", "target": "agent"},
        {"source": "agent", "target": "remember"},
        {"source": "remember", "target": "END"},
    ],
}


def ensure_demo_workflow(*, reset=False):
    """Create the demo workflow if missing (with `reset`, restore its definition); returns (workflow, created)."""
    from .models import Workflow

    method = Workflow.objects.update_or_create if reset else Workflow.objects.get_or_create
    return method(
        slug=DEMO_SLUG,
        defaults={
            "name": "Demo: remembers who you are",
            "description": "Telegram -> identify_user -> recall -> agent -> remember.",
            "definition": DEMO_DEFINITION,
            "is_active": True,
        },
    )
