import { describe, expect, it } from "vitest";
import { copySelection, describeDifferences, edgeHandles, freeNodeId, parseImport, pasteInto } from "./graph";
import { applyEvent, emptyRun } from "./runState";
import type { Definition, NodeTypeSpec } from "./types";

const spec = (name: string, inputs: string[], outputs: string[]): NodeTypeSpec => ({ name, category: "c", description: "", config_schema: {}, inputs, outputs });

const definition: Definition = {
  nodes: [
    { id: "a", type: "t", config: { k: 1 }, position: { x: 0, y: 0 } },
    { id: "b", type: "t", config: {}, position: { x: 300, y: 0 } },
  ],
  edges: [
    { source: "START", target: "a" },
    { source: "a", target: "b" },
  ],
};

describe("copy and paste as JSON", () => {
  it("pastes copies with free ids, their edges renamed, offset from the originals", () => {
    const text = copySelection(definition, new Set(["a", "b"]));
    const pasted = pasteInto(definition, text)!;
    expect(pasted.ids).toEqual(["a_2", "b_2"]);
    expect(pasted.definition.nodes).toHaveLength(4);
    expect(pasted.definition.edges).toContainEqual({ source: "a_2", target: "b_2" });
    expect(pasted.definition.nodes[2].position).toEqual({ x: 40, y: 40 });
    expect(pasted.definition.edges.filter((e) => e.source === "START")).toHaveLength(1); // START is not copied
  });

  it("refuses text that is not a copy of nodes", () => {
    expect(pasteInto(definition, "hello")).toBeNull();
    expect(pasteInto(definition, '{"nodes": [{"id": "x"}]}')).toBeNull();
  });

  it("derives ids from the type name that the server accepts", () => {
    expect(freeNodeId({ nodes: [], edges: [] }, "9 lives!")).toBe("n_9_lives_");
    expect(freeNodeId(definition, "a")).toBe("a_2");
  });
});

describe("ports", () => {
  it("draws an edge between the output and input both sides share, else the first of each", () => {
    expect(edgeHandles(spec("x", [], ["user", "memories"]), spec("y", ["messages", "memories"], []))).toEqual({ sourceHandle: "memories", targetHandle: "memories" });
    expect(edgeHandles(spec("x", [], ["p"]), spec("y", ["q", "r"], []))).toEqual({ sourceHandle: "p", targetHandle: "q" });
    expect(edgeHandles(undefined, undefined)).toEqual({ sourceHandle: "out", targetHandle: "in" });
  });
});

describe("import and the stale-save comparison", () => {
  it("imports a definition or an exported workflow, and names what is wrong otherwise", () => {
    expect(parseImport(JSON.stringify(definition)).definition).toEqual(definition);
    expect(parseImport(JSON.stringify({ name: "n", definition })).name).toBe("n");
    expect(() => parseImport("{")).toThrow(/not JSON/);
    expect(() => parseImport('{"nodes": 3}')).toThrow(/nodes/);
  });

  it("lists every difference between two versions", () => {
    const theirs: Definition = { ...definition, nodes: [{ ...definition.nodes[0], config: { k: 2 } }], edges: [{ source: "START", target: "a" }] };
    expect(describeDifferences(definition, theirs)).toEqual(["node a: config differs", "node b (t): only in yours", "edge a -> b: only in yours"]);
  });
});

describe("run events", () => {
  it("folds a streamed run into node states with their memory", () => {
    let view = emptyRun();
    for (const event of [
      { event: "run_started", data: { run_id: 3 } },
      { event: "node_started", data: { node: "recall", input: { messages: [] } } },
      { event: "node_finished", data: { node: "recall", output: { memories: [] }, duration_ms: 4.5, memory: { hits: [{ kind: "fact", text: "name: Ada", score: 0.9 }], scopes: { name: "user" } } } },
      { event: "node_error", data: { node: "agent", error: "boom" } },
      { event: "run_finished", data: { run_id: 3, status: "failed", reply: "", errors: ["agent: boom"] } },
    ])
      view = applyEvent(view, event);
    expect(view.runId).toBe(3);
    expect(view.status).toBe("failed");
    expect(view.nodes.recall).toMatchObject({ status: "done", durationMs: 4.5, input: { messages: [] }, memory: { scopes: { name: "user" } } });
    expect(view.nodes.agent).toMatchObject({ status: "error", error: "boom" });
  });
});
