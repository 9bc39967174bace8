"""Workflow definitions: validation against the node registry, and compilation into a StateGraph.

A definition is a JSON object:

    {"nodes": [{"id": "recall", "type": "recall", "config": {...}}, ...],
     "edges": [{"source": "START", "target": "identify"}, ...,
               {"source": "check", "target": "agent", "when": "needs_agent"}]}

Edges without `when` always run (several of them fan out in parallel). A node whose edges carry
`when` routes: the first edge whose state key is truthy is taken, else its edge without `when`, else
the run ends. A node with no outgoing edge ends the run. Every node must be reachable from START, and
every cycle needs an exit (a routing node in it that can leave it).

The visual builder keeps its layout in the definition too: each node may carry `position` ({"x", "y"},
numbers) and `label` (a string), and the definition `layout` ({"viewport": {"x", "y", "zoom"}}). The
compiler ignores them; validation checks their types like the rest.

`triggers` configures the workflow's triggers beyond the graph: {"webhook": {"reminder_url": "https://..."}}
is where reminders set in this workflow's conversations are POSTed when their channel has no push API
of its own (workflows.channels.sending).
"""

import math
import re
from dataclasses import dataclass

from jsonschema import Draft202012Validator

from ..exceptions import InvalidDefinition
from .registry import BuildContext, get_node_type

START_NAME, END_NAME = "START", "END"
_NODE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# What a node may carry: the compiler reads id, type and config; position and label are the builder's.
NODE_KEYS = {"id", "type", "config", "position", "label"}
MAX_LABEL_LENGTH = 200


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
    """Check a definition; raise the first InvalidDefinition (it names the node, edge and field at fault)."""
    definition, errors = check_definition(data)
    if errors:
        raise errors[0]
    return definition


def definition_errors(data) -> list[InvalidDefinition]:
    """Every problem of a definition found in one pass (the builder marks them all), [] if it is valid."""
    return check_definition(data)[1]


def check_definition(data) -> tuple[Definition | None, list[InvalidDefinition]]:
    """(the definition, []) when valid, else (None, the errors).

    Each node and each edge is checked on its own, so one bad config does not hide another; the
    graph's shape (routing, reachability, cycles) is checked once its parts are all sound.
    """
    if not isinstance(data, dict):
        return None, [InvalidDefinition("definition must be a JSON object with 'nodes' and 'edges'")]
    unknown = set(data) - {"nodes", "edges", "layout", "triggers"}
    if unknown:
        return None, [InvalidDefinition(f"definition has unknown key(s) {sorted(unknown)}", field=sorted(unknown)[0])]
    errors = _check_layout(data.get("layout")) + _check_triggers(data.get("triggers"))
    raw_nodes, raw_edges = data.get("nodes"), data.get("edges", [])
    if not isinstance(raw_nodes, list) or not raw_nodes:
        errors.append(InvalidDefinition("definition.nodes must be a non-empty list", field="nodes"))
    if not isinstance(raw_edges, list):
        errors.append(InvalidDefinition("definition.edges must be a list", field="edges"))
    if errors:
        return None, errors
    nodes = []
    for i, raw in enumerate(raw_nodes):
        node, problems = _node(i, raw)
        errors += problems
        if node is not None:
            nodes.append(node)
    ids = [n.id for n in nodes]
    for n in nodes:
        if ids.count(n.id) > 1 and n is next(m for m in nodes if m.id == n.id):
            errors.append(InvalidDefinition("node id is used twice", node=n.id, field="id"))
    # Edges are checked against every id given, so a node with a bad config does not also dangle its edges.
    given = {raw.get("id") for raw in raw_nodes if isinstance(raw, dict) and isinstance(raw.get("id"), str)}
    edges = []
    for i, raw in enumerate(raw_edges):
        try:
            edges.append(_edge(i, raw, given))
        except InvalidDefinition as exc:
            errors.append(exc.located(edge=i))
    if errors:
        return None, errors
    definition = Definition(tuple(nodes), tuple(edges))
    for check in (_check_routing, _check_reachable, _check_cycles, _check_conversation_memory):
        try:
            check(definition)
        except InvalidDefinition as exc:
            errors.append(exc)
    return (None, errors) if errors else (definition, [])


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


MAX_URL_LENGTH = 255  # a reminder's `destination` holds it


def _check_triggers(triggers):
    """{"webhook": {"reminder_url": an http(s) URL}}; every part optional."""
    if triggers is None:
        return []
    if not isinstance(triggers, dict) or set(triggers) - {"webhook"}:
        return [InvalidDefinition("definition.triggers must be an object with only 'webhook'", field="triggers")]
    webhook = triggers.get("webhook")
    if webhook is None:
        return []
    if not isinstance(webhook, dict) or set(webhook) - {"reminder_url"}:
        return [
            InvalidDefinition(
                "definition.triggers.webhook must be an object with only 'reminder_url'", field="triggers.webhook"
            )
        ]
    url = webhook.get("reminder_url")
    if url is None:
        return []
    if (
        not isinstance(url, str)
        or not re.match(r"^https?://[^\s/]+", url)
        or len(url) > MAX_URL_LENGTH
        or any(c.isspace() for c in url)
    ):
        return [
            InvalidDefinition(
                f"definition.triggers.webhook.reminder_url must be an http(s) URL of at most {MAX_URL_LENGTH} characters",
                field="triggers.webhook.reminder_url",
            )
        ]
    return []


def reminder_url(definition):
    """The URL a workflow's reminders are POSTed to ("" when none is configured)."""
    triggers = definition.get("triggers") if isinstance(definition, dict) else None
    webhook = triggers.get("webhook") if isinstance(triggers, dict) else None
    url = webhook.get("reminder_url") if isinstance(webhook, dict) else None
    return url if isinstance(url, str) else ""


def _check_layout(layout):
    """The canvas's view of the workflow (ignored by the compiler): {"viewport": {"x", "y", "zoom"}}."""
    if layout is None:
        return []
    if not isinstance(layout, dict) or set(layout) - {"viewport"}:
        return [InvalidDefinition("definition.layout must be an object with only 'viewport'", field="layout")]
    viewport = layout.get("viewport")
    if viewport is None:
        return []
    if not isinstance(viewport, dict) or set(viewport) != {"x", "y", "zoom"}:
        return [
            InvalidDefinition(
                "definition.layout.viewport must be an object with x, y and zoom", field="layout.viewport"
            )
        ]
    errors = [
        InvalidDefinition(f"definition.layout.viewport.{k} must be a number", field=f"layout.viewport.{k}")
        for k in ("x", "y", "zoom")
        if not _number(viewport[k])
    ]
    if not errors and viewport["zoom"] <= 0:
        errors.append(
            InvalidDefinition("definition.layout.viewport.zoom must be above 0", field="layout.viewport.zoom")
        )
    return errors


def _check_position(position, node_id):
    if position is None:
        return []
    if not isinstance(position, dict) or set(position) != {"x", "y"}:
        return [InvalidDefinition("position must be an object with x and y", node=node_id, field="position")]
    return [
        InvalidDefinition(f"position.{k} must be a number", node=node_id, field=f"position.{k}")
        for k in ("x", "y")
        if not _number(position[k])
    ]


def _check_label(label, node_id):
    if label is None:
        return []
    if not isinstance(label, str) or len(label) > MAX_LABEL_LENGTH or "\x00" in label:
        return [
            InvalidDefinition(
                f"label must be a string of at most {MAX_LABEL_LENGTH} characters", node=node_id, field="label"
            )
        ]
    return []


def _node(index, raw):
    """(the node, []) or (None or the node, [its problems]): a node's config errors are all reported."""
    if not isinstance(raw, dict):
        return None, [
            InvalidDefinition(
                f"definition.nodes[{index}] must be an object with id, type and config", field=f"nodes.{index}"
            )
        ]
    node_id = raw.get("id")
    if not isinstance(node_id, str) or not _NODE_ID.match(node_id) or node_id in (START_NAME, END_NAME):
        return None, [
            InvalidDefinition(
                f"definition.nodes[{index}].id must be a letter then letters, digits, '_' or '-' "
                f"(at most 64, not START/END), got {node_id!r}",
                field=f"nodes.{index}.id",
            )
        ]
    extra = set(raw) - NODE_KEYS
    if extra:
        return None, [InvalidDefinition(f"unknown key(s) {sorted(extra)}", node=node_id, field=sorted(extra)[0])]
    errors = _check_position(raw.get("position"), node_id) + _check_label(raw.get("label"), node_id)
    try:
        node_type = get_node_type(raw.get("type"), node=node_id)
    except InvalidDefinition as exc:
        return None, [*errors, exc.located(field="type")]
    config = raw.get("config", {})
    if config is None:
        config = {}
    schema_errors = sorted(
        Draft202012Validator(node_type.config_schema).iter_errors(config), key=lambda e: list(e.path)
    )
    for error in schema_errors:
        where = ".".join(str(p) for p in error.path)
        field = f"config{'.' + where if where else ''}"
        errors.append(InvalidDefinition(f"{field}: {error.message}", node=node_id, field=field))
    if not schema_errors and node_type.check is not None:
        try:
            node_type.check(config)
        except InvalidDefinition as exc:
            errors.append(InvalidDefinition(exc.message, node=node_id, field=exc.field or "config"))
    spec = NodeSpec(node_id, node_type.name, config)
    return spec, errors


def _edge(index, raw, ids):
    where = f"definition.edges[{index}]"
    if not isinstance(raw, dict) or set(raw) - {"source", "target", "when"}:
        raise InvalidDefinition(f"{where} must be an object with source, target and optionally when")
    source, target, when = raw.get("source"), raw.get("target"), raw.get("when")
    if source == END_NAME or (source not in ids and source != START_NAME):
        raise InvalidDefinition(f"{where}.source: dangling edge from unknown node {source!r}", field="source")
    if target == START_NAME or (target not in ids and target != END_NAME):
        raise InvalidDefinition(f"dangling edge to unknown node {target!r}", node=source, field="target")
    if when is not None and (not isinstance(when, str) or not when.strip()):
        raise InvalidDefinition(f"{where}.when must be the name of a state key", node=source, field="when")
    if when is not None and source == START_NAME:
        raise InvalidDefinition(f"{where}: edges from START cannot carry 'when'", field="when")
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
    # LangGraph here, not at the top: validating a definition, or reading its reminder URL (a task
    # worker delivering reminders), needs none of it.
    from langgraph.graph import END, START, StateGraph

    from .state import WorkflowState

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
    from langgraph.graph import END

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
