// Between a workflow definition (what the server stores) and the canvas's nodes and edges.
// START and END are the definition's own entry and exit, drawn as small fixed nodes.
import type { Edge, Node } from "@xyflow/react";
import { stepGeometry, terminalGeometry, type Geometry } from "./geometry";
import type { NodeRunState } from "./nodes";
import type { Definition, DefinitionEdge, DefinitionNode, NodeTypeSpec } from "./types";

export const START = "START";
export const END = "END";
export const GENERIC_IN = "in";
export const GENERIC_OUT = "out";
const NODE_ID = /^[A-Za-z][A-Za-z0-9_-]{0,63}$/;

/**
 * What a step node draws. Its last run state and the errors named on it travel in its own data, so a
 * run event or a validation answer re-renders only the nodes it changes.
 */
export interface StepData extends Record<string, unknown> {
  node: DefinitionNode;
  spec?: NodeTypeSpec;
  run?: NodeRunState;
  errors?: string[];
}

/** What the canvas shows over the definition: the last run's state and the server's errors per node. */
export interface Overlay {
  runs: Record<string, NodeRunState>;
  errors: Record<string, string[]>;
}

export function emptyDefinition(): Definition {
  return { nodes: [], edges: [] };
}

/** The handles a node shows: one per input (left) and output (right) of its type. */
export function inputHandles(spec?: NodeTypeSpec): string[] {
  return spec && spec.inputs.length ? spec.inputs : [GENERIC_IN];
}

export function outputHandles(spec?: NodeTypeSpec): string[] {
  return spec && spec.outputs.length ? spec.outputs : [GENERIC_OUT];
}

/**
 * Which ports an edge is drawn between: the first output of the source that the target reads (the
 * state the edge hands over), else the first of each. The definition keeps only source and target.
 */
export function edgeHandles(source?: NodeTypeSpec, target?: NodeTypeSpec): { sourceHandle: string; targetHandle: string } {
  const outs = outputHandles(source);
  const ins = inputHandles(target);
  const shared = outs.find((port) => ins.includes(port));
  return shared ? { sourceHandle: shared, targetHandle: shared } : { sourceHandle: outs[0], targetHandle: ins[0] };
}

export function edgeId(edge: DefinitionEdge, index: number): string {
  return `e${index}:${edge.source}->${edge.target}${edge.when ? `?${edge.when}` : ""}`;
}

/** A node id that is free in the definition, derived from the type's name. */
export function freeNodeId(definition: Definition, typeName: string): string {
  let base = typeName.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 56);
  if (!/^[A-Za-z]/.test(base)) base = `n_${base}`;
  if (base === START || base === END) base = `${base}_node`;
  const taken = new Set(definition.nodes.map((n) => n.id));
  if (!taken.has(base)) return base;
  for (let i = 2; ; i++) if (!taken.has(`${base}_${i}`)) return `${base}_${i}`;
}

export function isValidNodeId(id: string): boolean {
  return NODE_ID.test(id) && id !== START && id !== END;
}

/** Where START and END stand when the definition does not say: left of the first node, right of the last. */
export function terminalPositions(definition: Definition): { start: { x: number; y: number }; end: { x: number; y: number } } {
  const positioned = definition.nodes.filter((n) => n.position);
  if (!positioned.length) return { start: { x: 20, y: 300 }, end: { x: 1100, y: 300 } };
  const xs = positioned.map((n) => n.position!.x);
  const ys = positioned.map((n) => n.position!.y);
  const y = ys.reduce((a, b) => a + b, 0) / ys.length + 40;
  return { start: { x: Math.min(...xs) - 200, y }, end: { x: Math.max(...xs) + 320, y } };
}

/** Nodes without a position get one, left to right in the order they come. */
export function withPositions(definition: Definition): Definition {
  if (definition.nodes.every((n) => n.position)) return definition;
  return {
    ...definition,
    nodes: definition.nodes.map((n, i) => (n.position ? n : { ...n, position: { x: 120 + (i % 8) * 280, y: 60 + Math.floor(i / 8) * 260 } })),
  };
}

const START_GEOMETRY = terminalGeometry({ type: "source", id: GENERIC_OUT });
const END_GEOMETRY = terminalGeometry({ type: "target", id: GENERIC_IN });

/**
 * A canvas node's size and handles, given up front (see geometry.ts): `measured` too, as React Flow
 * counts a node as measured (for fitting the view) only by it, and never measures a node given both.
 */
function sized({ width, height, handles }: Geometry): Pick<Node, "width" | "height" | "measured" | "handles"> {
  return { width, height, measured: { width, height }, handles };
}

export function toFlowNodes(
  definition: Definition,
  specs: Map<string, NodeTypeSpec>,
  terminals: { start: { x: number; y: number }; end: { x: number; y: number } },
  selected: Set<string> = new Set(),
  overlay: Overlay = { runs: {}, errors: {} },
): Node[] {
  const nodes: Node[] = [
    { id: START, type: "terminal", position: terminals.start, data: { kind: START }, deletable: false, selected: selected.has(START), ...sized(START_GEOMETRY) },
  ];
  for (const node of definition.nodes) {
    const spec = specs.get(node.type);
    const data: StepData = { node, spec };
    if (overlay.runs[node.id]) data.run = overlay.runs[node.id];
    if (overlay.errors[node.id]?.length) data.errors = overlay.errors[node.id];
    const geometry = stepGeometry({ inputs: inputHandles(spec), outputs: outputHandles(spec), unknownType: !spec, error: Boolean(data.errors), run: Boolean(data.run) });
    nodes.push({ id: node.id, type: "step", position: node.position ?? { x: 0, y: 0 }, data, selected: selected.has(node.id), ...sized(geometry) });
  }
  nodes.push({ id: END, type: "terminal", position: terminals.end, data: { kind: END }, deletable: false, selected: selected.has(END), ...sized(END_GEOMETRY) });
  return nodes;
}

export function toFlowEdges(definition: Definition, specs: Map<string, NodeTypeSpec>, selected: Set<string> = new Set()): Edge[] {
  const typeOf = new Map(definition.nodes.map((n) => [n.id, specs.get(n.type)]));
  return definition.edges.map((edge, index) => {
    const id = edgeId(edge, index);
    const handles = edgeHandles(typeOf.get(edge.source), typeOf.get(edge.target));
    return {
      id,
      source: edge.source,
      target: edge.target,
      sourceHandle: edge.source === START ? GENERIC_OUT : handles.sourceHandle,
      targetHandle: edge.target === END ? GENERIC_IN : handles.targetHandle,
      label: edge.when ? `when ${edge.when}` : undefined,
      data: { index },
      selected: selected.has(id),
    };
  });
}

/** A copy of some nodes (and the edges between them) as JSON text, for the clipboard. */
export function copySelection(definition: Definition, ids: Set<string>): string {
  const nodes = definition.nodes.filter((n) => ids.has(n.id));
  const edges = definition.edges.filter((e) => ids.has(e.source) && ids.has(e.target));
  return JSON.stringify({ nodes, edges }, null, 2);
}

/**
 * Paste nodes copied as JSON: each gets a free id (edges follow the renaming) and stands a little
 * apart from the original. Returns null when the text is not such a copy.
 */
export function pasteInto(definition: Definition, text: string, offset = 40): { definition: Definition; ids: string[] } | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return null;
  }
  if (!parsed || typeof parsed !== "object" || !Array.isArray((parsed as Definition).nodes)) return null;
  const source = parsed as Definition;
  let next: Definition = { ...definition, nodes: [...definition.nodes], edges: [...definition.edges] };
  const renamed = new Map<string, string>();
  const ids: string[] = [];
  for (const raw of source.nodes) {
    if (!raw || typeof raw !== "object" || typeof raw.type !== "string") return null;
    const id = freeNodeId(next, typeof raw.id === "string" && isValidNodeId(raw.id) ? raw.id : raw.type);
    renamed.set(raw.id, id);
    ids.push(id);
    const position = raw.position ? { x: raw.position.x + offset, y: raw.position.y + offset } : { x: offset, y: offset };
    next = { ...next, nodes: [...next.nodes, { ...raw, id, position, config: structuredClone(raw.config ?? {}) }] };
  }
  for (const edge of Array.isArray(source.edges) ? source.edges : []) {
    const s = renamed.get(edge.source);
    const t = renamed.get(edge.target);
    if (s && t) next.edges.push({ ...edge, source: s, target: t });
  }
  return { definition: next, ids };
}

/** Remove nodes and edges (edges touching a removed node go too). */
export function removeFromDefinition(definition: Definition, nodeIds: Set<string>, edgeIndexes: Set<number>): Definition {
  return {
    ...definition,
    nodes: definition.nodes.filter((n) => !nodeIds.has(n.id)),
    edges: definition.edges.filter((e, i) => !edgeIndexes.has(i) && !nodeIds.has(e.source) && !nodeIds.has(e.target)),
  };
}

/** Parse an imported file: a definition, or a workflow (as exported or as the API returns it). */
export function parseImport(text: string): { definition: Definition; name?: string } {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (error) {
    throw new Error(`not JSON: ${(error as Error).message}`);
  }
  if (!data || typeof data !== "object") throw new Error("expected a JSON object with nodes and edges");
  const record = data as Record<string, unknown>;
  const definition = (record.definition ?? record) as Definition;
  if (!Array.isArray(definition.nodes)) throw new Error("nodes: expected a list of nodes");
  if (definition.edges !== undefined && !Array.isArray(definition.edges)) throw new Error("edges: expected a list of edges");
  return {
    definition: { ...definition, edges: definition.edges ?? [] },
    name: typeof record.name === "string" ? record.name : undefined,
  };
}

/** What differs between two definitions, for the stale-save dialog. */
export function describeDifferences(mine: Definition, theirs: Definition): string[] {
  const lines: string[] = [];
  const mineById = new Map(mine.nodes.map((n) => [n.id, n]));
  const theirsById = new Map(theirs.nodes.map((n) => [n.id, n]));
  for (const [id, node] of mineById) {
    const other = theirsById.get(id);
    if (!other) lines.push(`node ${id} (${node.type}): only in yours`);
    else {
      if (JSON.stringify(node.config ?? {}) !== JSON.stringify(other.config ?? {})) lines.push(`node ${id}: config differs`);
      if (node.type !== other.type) lines.push(`node ${id}: type ${node.type} in yours, ${other.type} in theirs`);
      if ((node.label ?? "") !== (other.label ?? "")) lines.push(`node ${id}: label differs`);
      if (JSON.stringify(node.position) !== JSON.stringify(other.position)) lines.push(`node ${id}: moved`);
    }
  }
  for (const [id, node] of theirsById) if (!mineById.has(id)) lines.push(`node ${id} (${node.type}): only in theirs`);
  const key = (e: DefinitionEdge) => `${e.source} -> ${e.target}${e.when ? ` when ${e.when}` : ""}`;
  const mineEdges = new Set(mine.edges.map(key));
  const theirEdges = new Set(theirs.edges.map(key));
  for (const e of mineEdges) if (!theirEdges.has(e)) lines.push(`edge ${e}: only in yours`);
  for (const e of theirEdges) if (!mineEdges.has(e)) lines.push(`edge ${e}: only in theirs`);
  return lines;
}

/** The definition without what only the canvas needs to compare (the viewport moves with every pan). */
export function comparable(definition: Definition): string {
  const { layout, ...rest } = definition;
  void layout;
  return JSON.stringify(rest);
}
