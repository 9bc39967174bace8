"""Workflow definitions: validation against the node registry, and compilation into a StateGraph.

A definition is a JSON object:

    {"nodes": [{"id": "recall", "type": "recall", "config": {...}}, ...],
     "edges": [{"source": "START", "target": "identify"}, ...,
               {"source": "check", "target": "agent", "when": "needs_agent"}]}

Edges without `when` always run (several of them fan out in parallel). A node whose edges carry
`when` routes: the first edge whose state key is truthy is taken, else its edge without `when`, else
the run ends. A node with no outgoing edge ends the run. Every node must be reachable from START, and
every cycle needs an exit (a routing node in it that can leave it).
"""

import re
from dataclasses import dataclass

from jsonschema import Draft202012Validator
from langgraph.graph import END, START, StateGraph

from .exceptions import InvalidDefinition
from .registry import BuildContext, get_node_type
from .state import WorkflowState

START_NAME, END_NAME = "START", "END"
_NODE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class NodeSpec:
    id: str
    type: str
    config: dict


@dataclass(frozen=True)
class EdgeSpec:
    source: str
    target: str
    when: str | None = None


@dataclass(frozen=True)
class Definition:
    nodes: tuple[NodeSpec, ...]
    edges: tuple[EdgeSpec, ...]

    def outgoing(self, node_id):
        return [e for e in self.edges if e.source == node_id]


def validate_definition(data) -> Definition:
    """Check a definition; raise InvalidDefinition naming the node (or part) at fault."""
    if not isinstance(data, dict):
        raise InvalidDefinition("definition must be a JSON object with 'nodes' and 'edges'")
    unknown = set(data) - {"nodes", "edges"}
    if unknown:
        raise InvalidDefinition(f"definition has unknown key(s) {sorted(unknown)}")
    raw_nodes, raw_edges = data.get("nodes"), data.get("edges", [])
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise InvalidDefinition("definition.nodes must be a non-empty list")
    if not isinstance(raw_edges, list):
        raise InvalidDefinition("definition.edges must be a list")
    nodes = [_node(i, raw) for i, raw in enumerate(raw_nodes)]
    ids = [n.id for n in nodes]
    for n in nodes:
        if ids.count(n.id) > 1:
            raise InvalidDefinition("node id is used twice", node=n.id)
    edges = [_edge(i, raw, set(ids)) for i, raw in enumerate(raw_edges)]
    definition = Definition(tuple(nodes), tuple(edges))
    _check_routing(definition)
    _check_reachable(definition)
    _check_cycles(definition)
    _check_conversation_memory(definition)
    return definition


def _node(index, raw):
    if not isinstance(raw, dict):
        raise InvalidDefinition(f"definition.nodes[{index}] must be an object with id, type and config")
    node_id = raw.get("id")
    if not isinstance(node_id, str) or not _NODE_ID.match(node_id) or node_id in (START_NAME, END_NAME):
        raise InvalidDefinition(
            f"definition.nodes[{index}].id must be a letter then letters, digits, '_' or '-' "
            f"(at most 64, not START/END), got {node_id!r}"
        )
    extra = set(raw) - {"id", "type", "config"}
    if extra:
        raise InvalidDefinition(f"unknown key(s) {sorted(extra)}", node=node_id)
    node_type = get_node_type(raw.get("type"), node=node_id)
    config = raw.get("config", {})
    if config is None:
        config = {}
    errors = sorted(Draft202012Validator(node_type.config_schema).iter_errors(config), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.path)
        raise InvalidDefinition(f"config{'.' + where if where else ''}: {first.message}", node=node_id)
    if node_type.check is not None:
        try:
            node_type.check(config)
        except InvalidDefinition as exc:
            raise InvalidDefinition(str(exc), node=node_id) from None
    return NodeSpec(node_id, node_type.name, config)


def _edge(index, raw, ids):
    where = f"definition.edges[{index}]"
    if not isinstance(raw, dict) or set(raw) - {"source", "target", "when"}:
        raise InvalidDefinition(f"{where} must be an object with source, target and optionally when")
    source, target, when = raw.get("source"), raw.get("target"), raw.get("when")
    if source == END_NAME or (source not in ids and source != START_NAME):
        raise InvalidDefinition(f"{where}.source: dangling edge from unknown node {source!r}")
    if target == START_NAME or (target not in ids and target != END_NAME):
        raise InvalidDefinition(f"dangling edge to unknown node {target!r}", node=source)
    if when is not None and (not isinstance(when, str) or not when.strip()):
        raise InvalidDefinition(f"{where}.when must be the name of a state key", node=source)
    if when is not None and source == START_NAME:
        raise InvalidDefinition(f"{where}: edges from START cannot carry 'when'")
    return EdgeSpec(source, target, when)


def _check_routing(definition):
    if not definition.outgoing(START_NAME):
        raise InvalidDefinition("no edge from START: which node runs first?")
    for node in definition.nodes:
        out = definition.outgoing(node.id)
        if any(e.when for e in out) and sum(1 for e in out if not e.when) > 1:
            raise InvalidDefinition(
                "a routing node (edges with 'when') may have only one edge without 'when'", node=node.id
            )


def _successors(definition, node_id):
    out = definition.outgoing(node_id)
    targets = {e.target for e in out}
    if not out or (any(e.when for e in out) and all(e.when for e in out)):
        targets.add(END_NAME)  # no edge, or no default route: the run may end here
    return targets


def _check_reachable(definition):
    seen, todo = set(), [START_NAME]
    while todo:
        current = todo.pop()
        for nxt in (
            _successors(definition, current)
            if current != START_NAME
            else {e.target for e in definition.outgoing(START_NAME)}
        ):
            if nxt not in seen:
                seen.add(nxt)
                if nxt != END_NAME:
                    todo.append(nxt)
    for node in definition.nodes:
        if node.id not in seen:
            raise InvalidDefinition("is not reachable from START", node=node.id)


def _check_cycles(definition):
    """Each strongly connected part with a cycle needs a routing node with a way out of it."""
    graph = {n.id: {t for t in _successors(definition, n.id) if t != END_NAME} for n in definition.nodes}
    for component in _strongly_connected(graph):
        cyclic = len(component) > 1 or any(n in graph[n] for n in component)
        if not cyclic:
            continue
        exits = [
            n
            for n in component
            if any(e.when for e in definition.outgoing(n)) and (_successors(definition, n) - component)
        ]
        if not exits:
            first = next(n.id for n in definition.nodes if n.id in component)
            loop = " -> ".join(n.id for n in definition.nodes if n.id in component)
            raise InvalidDefinition(
                f"cycle without exit ({loop}): give a node in it an edge with 'when' that leaves the cycle", node=first
            )


def _strongly_connected(graph):
    """Tarjan's algorithm, iterative; yields sets of node ids."""
    index, low, stack, on_stack, counter = {}, {}, [], set(), [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                yield component


def _check_conversation_memory(definition):
    """Conversation memory keys a thread by (user, conversation, workflow): one agent per workflow may use it."""
    remembering = [n.id for n in definition.nodes if n.type == "agent" and n.config.get("conversation_memory", True)]
    if len(remembering) > 1:
        raise InvalidDefinition(
            f"only one agent node per workflow may keep conversation memory (also on: {', '.join(remembering[:-1])})",
            node=remembering[-1],
        )


def compile_definition(definition: Definition, *, workflow_id, workflow_slug):
    """A compiled StateGraph for a validated definition."""
    graph = StateGraph(WorkflowState)
    for node in definition.nodes:
        node_type = get_node_type(node.type, node=node.id)
        context = BuildContext(workflow_id=workflow_id, workflow_slug=workflow_slug, node_id=node.id)
        graph.add_node(node.id, node_type.build(node.config, context))
    for target in sorted({e.target for e in definition.outgoing(START_NAME)}):
        graph.add_edge(START, target)
    for node in definition.nodes:
        out = definition.outgoing(node.id)
        if not out:
            graph.add_edge(node.id, END)
        elif any(e.when for e in out):
            graph.add_conditional_edges(node.id, _router(out), _path_map(out))
        else:
            for edge in out:
                graph.add_edge(node.id, END if edge.target == END_NAME else edge.target)
    return graph.compile(name=workflow_slug)


def _path_map(edges):
    targets = {e.target for e in edges} | {END_NAME}
    return {t: (END if t == END_NAME else t) for t in targets}


def _router(edges):
    conditional = [e for e in edges if e.when]
    default = next((e.target for e in edges if not e.when), END_NAME)

    def route(state):
        for edge in conditional:
            if state.get(edge.when):
                return edge.target
        return default

    return route
