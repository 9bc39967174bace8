"""The node registry: every node type a workflow can use, described for a visual builder's palette."""

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..exceptions import InvalidDefinition


@dataclass(frozen=True)
class BuildContext:
    """What a node factory knows of the workflow it is built into."""

    workflow_id: int
    workflow_slug: str
    node_id: str

    @property
    def agent_id(self):
        """Agent-scoped memory of a workflow's nodes belongs to the workflow (its slug)."""
        return self.workflow_slug


@dataclass(frozen=True)
class NodeType:
    """A node type: `build(config, context)` returns the node callable `(state, config) -> partial update`."""

    name: str
    category: str
    description: str
    config_schema: dict
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    build: Callable[[dict, BuildContext], Callable]
    # Checks beyond the JSON Schema; raises InvalidDefinition (without a node name: the caller adds it).
    check: Callable[[dict], None] | None = None
    extra: dict = field(default_factory=dict)

    def describe(self):
        return {
            "name": self.name,
            "category": self.category,
            "description": self.description,
            "config_schema": self.config_schema,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
        }


_registry: dict[str, NodeType] = {}
# Modules whose import registers node types, imported on the first look-up: the built-in types
# (workflows.graph.nodes, named by the app's ready()) import LangGraph and LangChain, about 26 MB a
# process that never builds a graph (a task worker embedding and linking) need not hold.
_modules: list[str] = []
_loading = threading.RLock()


def register(node_type: NodeType):
    if node_type.name in _registry:
        raise ValueError(f"node type {node_type.name!r} is registered twice")
    _registry[node_type.name] = node_type
    return node_type


def register_module(name: str):
    """Import module `name` (which registers node types) before the registry is first read."""
    with _loading:
        _modules.append(name)


def _load():
    if _modules:
        with _loading:  # another thread's look-up waits until the types are all registered
            while _modules:
                importlib.import_module(_modules[0])
                _modules.pop(0)


def node_types() -> list[NodeType]:
    _load()
    return sorted(_registry.values(), key=lambda t: (t.category, t.name))


def get_node_type(name: str, *, node=None) -> NodeType:
    _load()
    try:
        return _registry[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(_registry))
        raise InvalidDefinition(f"unknown node type {name!r} (known: {known})", node=node) from None
