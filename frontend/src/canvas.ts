// Keeping the canvas's node and edge objects stable across edits, run events and validation answers.
// React Flow re-renders every node whose object is new; rebuilding all of them on each change made a
// large workflow slow to open and to edit. Here an object is replaced only when what it draws changed.
import { getViewportForBounds, type Edge, type Node, type ReactFlowInstance } from "@xyflow/react";
import { useCallback, useEffect, useState, type RefObject } from "react";
import { stepGeometry, TERMINAL } from "./geometry";
import { inputHandles, outputHandles } from "./graph";
import type { Definition, NodeTypeSpec, Viewport } from "./types";

function sameList(a: readonly unknown[] | undefined, b: readonly unknown[] | undefined): boolean {
  if (a === b) return true;
  if (!a || !b || a.length !== b.length) return false;
  return a.every((item, i) => item === b[i]);
}

function sameData(a: Record<string, unknown>, b: Record<string, unknown>): boolean {
  if (a === b) return true;
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  return keys.every((key) => {
    const x = a[key];
    const y = b[key];
    return x === y || (Array.isArray(x) && Array.isArray(y) && sameList(x, y));
  });
}

/**
 * The next nodes, reusing each previous node object that draws the same thing. Selection and dragging
 * come from the previous object (the canvas owns them, not the definition); the size comes with the
 * node (geometry.ts), so a replaced node is drawn at once, never measured.
 */
export function reconcileNodes(previous: Node[], next: Node[]): Node[] {
  if (!previous.length) return next;
  const before = new Map(previous.map((n) => [n.id, n]));
  let changed = previous.length !== next.length;
  const result = next.map((node, i) => {
    const old = before.get(node.id);
    if (!old) {
      changed = true;
      return node;
    }
    const same =
      old.type === node.type &&
      old.position.x === node.position.x &&
      old.position.y === node.position.y &&
      old.deletable === node.deletable &&
      sameData(old.data, node.data);
    if (same) {
      if (previous[i] !== old) changed = true;
      return old;
    }
    changed = true;
    return { ...node, selected: old.selected, dragging: old.dragging };
  });
  return changed ? result : previous;
}

/** Select exactly these nodes, replacing only the objects whose selection changes. */
export function selectOnly(nodes: Node[], ids: Set<string>): Node[] {
  return nodes.map((n) => (Boolean(n.selected) === ids.has(n.id) ? n : { ...n, selected: ids.has(n.id) }));
}

const EDGE_KEYS = ["source", "target", "sourceHandle", "targetHandle", "label", "className", "animated", "selected"] as const;

/** The next edges, reusing each previous edge object that draws the same thing. */
export function reconcileEdges(previous: Edge[], next: Edge[]): Edge[] {
  if (!previous.length) return next;
  const before = new Map(previous.map((e) => [e.id, e]));
  let changed = previous.length !== next.length;
  const result = next.map((edge, i) => {
    const old = before.get(edge.id);
    if (old && EDGE_KEYS.every((key) => old[key] === edge[key]) && sameData(old.data ?? {}, edge.data ?? {})) {
      if (previous[i] !== old) changed = true;
      return old;
    }
    changed = true;
    return edge;
  });
  return changed ? result : previous;
}

/**
 * Where to look so the whole workflow fits the canvas, from the positions and each node's size
 * (geometry.ts): the first render can then draw the nodes where they will stay, instead of drawing them
 * at scale 1 and fitting afterwards (which draws a large workflow twice).
 */
export function fittingViewport(
  definition: Definition,
  specs: Map<string, NodeTypeSpec>,
  terminals: { start: { x: number; y: number }; end: { x: number; y: number } },
  size: { width: number; height: number },
  options: { padding: number; minZoom: number; maxZoom: number },
): Viewport | null {
  if (!definition.nodes.length || size.width <= 0 || size.height <= 0) return null;
  let x0 = Math.min(terminals.start.x, terminals.end.x);
  let y0 = Math.min(terminals.start.y, terminals.end.y);
  let x1 = Math.max(terminals.start.x, terminals.end.x) + TERMINAL.width;
  let y1 = Math.max(terminals.start.y, terminals.end.y) + TERMINAL.height;
  for (const node of definition.nodes) {
    const at = node.position ?? { x: 0, y: 0 };
    const spec = specs.get(node.type);
    const { width, height } = stepGeometry({ inputs: inputHandles(spec), outputs: outputHandles(spec), unknownType: !spec });
    x0 = Math.min(x0, at.x);
    y0 = Math.min(y0, at.y);
    x1 = Math.max(x1, at.x + width);
    y1 = Math.max(y1, at.y + height);
  }
  return getViewportForBounds({ x: x0, y: y0, width: x1 - x0, height: y1 - y0 }, size.width, size.height, options.minZoom, options.maxZoom, options.padding);
}


type Terminals = { start: { x: number; y: number }; end: { x: number; y: number } };
const FIT = { padding: 0.15, maxZoom: 1.2, minZoom: 0.1 };

/**
 * Fitting a definition to the canvas: at once where the fit will be, from its positions alone, so its
 * nodes are drawn there once; then exactly, once the canvas holds them (React Flow's store has them when
 * the effect runs: its own effects run first), which React Flow does as soon as it has measured them.
 * Returns `fitSoon(definition)`.
 */
export function useFitting(
  flow: ReactFlowInstance,
  canvas: RefObject<HTMLDivElement | null>,
  specs: { current: Map<string, NodeTypeSpec> },
  terminals: { current: Terminals },
  present: () => Definition,
  shownNodes: Node[],
) {
  const [pending, setPending] = useState(false);
  const fitSoon = useCallback(
    (definition: Definition) => {
      if (canvas.current) {
        const size = { width: canvas.current.clientWidth, height: canvas.current.clientHeight };
        const viewport = fittingViewport(definition, specs.current, terminals.current, size, FIT);
        if (viewport) flow.setViewport(viewport);
      }
      setPending(true);
    },
    [flow, canvas, specs, terminals],
  );
  useEffect(() => {
    if (!pending) return;
    const shown = new Set(shownNodes.map((n) => n.id));
    if (!present().nodes.every((n) => shown.has(n.id))) return;
    setPending(false);
    flow.fitView(FIT);
  }, [pending, shownNodes, flow, present]);
  return fitSoon;
}
