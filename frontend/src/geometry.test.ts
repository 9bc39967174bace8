import { describe, expect, it } from "vitest";
import { BORDER, HEAD, HANDLE, NOTE, PORT_ROW, PORTS_MARGIN, STEP_WIDTH, stepGeometry, terminalGeometry } from "./geometry";
import { toFlowNodes } from "./graph";
import type { NodeTypeSpec } from "./types";

const recall: NodeTypeSpec = { name: "recall", category: "memory", description: "", config_schema: {}, inputs: ["messages", "user"], outputs: ["memories", "memory_prompt", "recall_trace"] };

describe("a node's size and handles, known before it is drawn", () => {
  it("puts one handle per port at the middle of its row, inputs left and outputs right", () => {
    const { width, height, handles } = stepGeometry({ inputs: recall.inputs, outputs: recall.outputs });
    expect(width).toBe(STEP_WIDTH);
    expect(height).toBe(2 * BORDER + HEAD + 2 * PORTS_MARGIN + 3 * PORT_ROW);
    const centre = (i: number) => BORDER + HEAD + PORTS_MARGIN + i * PORT_ROW + PORT_ROW / 2;
    expect(handles.map((h) => [h.type, h.id, h.position, h.x + HANDLE / 2, h.y + HANDLE / 2])).toEqual([
      ["target", "messages", "left", BORDER, centre(0)],
      ["target", "user", "left", BORDER, centre(1)],
      ["source", "memories", "right", STEP_WIDTH - BORDER, centre(0)],
      ["source", "memory_prompt", "right", STEP_WIDTH - BORDER, centre(1)],
      ["source", "recall_trace", "right", STEP_WIDTH - BORDER, centre(2)],
    ]);
  });

  it("grows by a line for an error or a run state, and moves the ports down under an unknown type's note", () => {
    const plain = stepGeometry({ inputs: ["in"], outputs: ["out"] });
    expect(stepGeometry({ inputs: ["in"], outputs: ["out"], error: true, run: true }).height).toBe(plain.height + 2 * NOTE);
    const unknown = stepGeometry({ inputs: ["in"], outputs: ["out"], unknownType: true });
    expect(unknown.height).toBe(plain.height + NOTE);
    expect(unknown.handles.map((h) => h.y)).toEqual(plain.handles.map((h) => h.y + NOTE));
  });

  it("gives START an output on its right and END an input on its left", () => {
    expect(terminalGeometry({ type: "source", id: "out" }).handles).toMatchObject([{ type: "source", id: "out", position: "right" }]);
    expect(terminalGeometry({ type: "target", id: "in" }).handles).toMatchObject([{ type: "target", id: "in", position: "left", x: -HANDLE / 2 }]);
  });

  it("hands every canvas node its size, so React Flow need not measure it", () => {
    const definition = { nodes: [{ id: "r", type: "recall", position: { x: 0, y: 0 } }, { id: "x", type: "gone" }], edges: [] };
    const nodes = toFlowNodes(definition, new Map([["recall", recall]]), { start: { x: 0, y: 0 }, end: { x: 500, y: 0 } });
    for (const node of nodes) {
      expect(node.measured).toEqual({ width: node.width, height: node.height });
      expect(node.handles?.length).toBeGreaterThan(0);
    }
    expect(nodes.find((n) => n.id === "x")!.height).toBe(stepGeometry({ inputs: ["in"], outputs: ["out"], unknownType: true }).height);
  });
});
