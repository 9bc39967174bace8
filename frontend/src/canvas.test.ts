import type { Node } from "@xyflow/react";
import { describe, expect, it } from "vitest";
import { fittingViewport, reconcileEdges, reconcileNodes, selectOnly } from "./canvas";
import { terminalPositions, toFlowEdges, toFlowNodes } from "./graph";
import type { Definition, NodeTypeSpec } from "./types";

const recall: NodeTypeSpec = { name: "recall", category: "memory", description: "", config_schema: {}, inputs: ["user", "messages"], outputs: ["memories"] };
const specs = new Map([[recall.name, recall]]);

function chain(n: number): Definition {
  const ids = Array.from({ length: n }, (_, i) => `r${i}`);
  return {
    nodes: ids.map((id, i) => ({ id, type: "recall", config: {}, position: { x: (i % 20) * 260, y: Math.floor(i / 20) * 200 } })),
    edges: ["START", ...ids].map((source, i) => ({ source, target: ids[i] ?? "END" })),
  };
}

describe("the canvas keeps its node objects across changes", () => {
  const definition = chain(200);
  const terminals = terminalPositions(definition);
  const measured = (): Node[] => toFlowNodes(definition, specs, terminals);

  it("replaces only the node a run event names, sized for the run line it now shows", () => {
    const before = measured();
    const after = reconcileNodes(before, toFlowNodes(definition, specs, terminals, new Set(), { runs: { r7: { status: "running" } }, errors: {} }));
    const replaced = after.filter((n, i) => n !== before[i]).map((n) => n.id);
    expect(replaced).toEqual(["r7"]);
    const old = before.find((n) => n.id === "r7")!;
    const now = after.find((n) => n.id === "r7")!;
    expect(now.measured).toEqual({ width: old.width, height: old.height! + 20 });
    expect(now.handles).toEqual(old.handles);
    expect((after.find((n) => n.id === "r7")!.data as { run: unknown }).run).toEqual({ status: "running" });
  });

  it("returns the same list when a validation answer changes nothing", () => {
    const before = measured();
    const again = reconcileNodes(before, toFlowNodes(definition, specs, terminals, new Set(), { runs: {}, errors: {} }));
    expect(again).toBe(before);
  });

  it("marks and unmarks only the node an error names", () => {
    const before = measured();
    const marked = reconcileNodes(before, toFlowNodes(definition, specs, terminals, new Set(), { runs: {}, errors: { r3: ["config.limit: too small"] } }));
    expect(marked.filter((n, i) => n !== before[i]).map((n) => n.id)).toEqual(["r3"]);
    const same = reconcileNodes(marked, toFlowNodes(definition, specs, terminals, new Set(), { runs: {}, errors: { r3: ["config.limit: too small"] } }));
    expect(same).toBe(marked);
    const cleared = reconcileNodes(same, toFlowNodes(definition, specs, terminals, new Set(), { runs: {}, errors: {} }));
    expect(cleared.filter((n, i) => n !== same[i]).map((n) => n.id)).toEqual(["r3"]);
  });

  it("replaces an edited node only, and adds a new one", () => {
    const before = measured();
    const edited: Definition = {
      ...definition,
      nodes: [...definition.nodes.map((n) => (n.id === "r1" ? { ...n, label: "renamed" } : n)), { id: "extra", type: "recall", position: { x: 0, y: 0 } }],
    };
    const after = reconcileNodes(before, toFlowNodes(edited, specs, terminalPositions(edited), new Set()));
    const kept = new Set(before);
    expect(after.filter((n) => !kept.has(n)).map((n) => n.id).sort()).toEqual(["END", "START", "extra", "r1"].sort());
  });

  it("selecting replaces only the nodes concerned", () => {
    const before = toFlowNodes(definition, specs, terminals);
    const selected = selectOnly(before, new Set(["r4"]));
    expect(selected.filter((n, i) => n !== before[i]).map((n) => [n.id, n.selected, n.measured])).toEqual([["r4", true, before[5].measured]]);
    const again = selectOnly(selected, new Set(["r4"]));
    expect(again.every((n, i) => n === selected[i])).toBe(true);
  });

  it("keeps edge objects unless their drawing changes", () => {
    const first = toFlowEdges(definition, specs);
    const again = reconcileEdges(first, toFlowEdges(definition, specs));
    expect(again).toBe(first);
    const ran = reconcileEdges(first, toFlowEdges(definition, specs).map((e, i) => (i === 2 ? { ...e, className: "ran" } : e)));
    expect(ran.filter((e, i) => e !== first[i])).toHaveLength(1);
  });
});

describe("the first view of a workflow", () => {
  it("fits every node, from positions and port counts alone", () => {
    const definition = chain(200);
    const viewport = fittingViewport(definition, specs, terminalPositions(definition), { width: 1000, height: 800 }, { padding: 0.15, minZoom: 0.1, maxZoom: 1.2 })!;
    // The right-most node (and END beyond it) and the bottom row are inside the canvas.
    const right = (19 * 260 + 200) * viewport.zoom + viewport.x;
    const bottom = (9 * 200 + 34 + 2 * 18) * viewport.zoom + viewport.y;
    expect(viewport.zoom).toBeGreaterThan(0.1);
    expect(viewport.zoom).toBeLessThan(0.3);
    expect(right).toBeLessThanOrEqual(1000);
    expect(bottom).toBeLessThanOrEqual(800);
    expect(viewport.x).toBeGreaterThanOrEqual(0);
  });

  it("has nothing to fit on an empty canvas", () => {
    const empty: Definition = { nodes: [], edges: [] };
    expect(fittingViewport(empty, specs, terminalPositions(empty), { width: 1000, height: 800 }, { padding: 0.15, minZoom: 0.1, maxZoom: 1.2 })).toBeNull();
  });
});
