import { describe, expect, it } from "vitest";
import { removeFromDefinition } from "./graph";
import { History } from "./history";
import type { Definition } from "./types";

const node = (id: string) => ({ id, type: "t", config: {}, position: { x: 0, y: 0 } });

describe("History (the undo stack)", () => {
  it("undoes and redoes change sets in order", () => {
    const h = new History<number>(0);
    h.push(1);
    h.push(2);
    expect(h.undo()).toBe(1);
    expect(h.undo()).toBe(0);
    expect(h.undo()).toBeUndefined();
    expect(h.present).toBe(0);
    expect(h.redo()).toBe(1);
    expect(h.redo()).toBe(2);
    expect(h.redo()).toBeUndefined();
    expect(h.present).toBe(2);
  });

  it("drops the redo branch when a new change is made after an undo", () => {
    const h = new History<string>("a");
    h.push("b");
    h.undo();
    h.push("c");
    expect(h.canRedo).toBe(false);
    expect(h.undo()).toBe("a");
  });

  it("records no step for a change that changes nothing", () => {
    const h = new History<Definition>({ nodes: [node("a")], edges: [] });
    expect(h.push({ nodes: [node("a")], edges: [] })).toBe(false);
    expect(h.canUndo).toBe(false);
  });

  it("brings a deleted node and its edges back", () => {
    const before: Definition = {
      nodes: [node("a"), node("b")],
      edges: [
        { source: "START", target: "a" },
        { source: "a", target: "b" },
      ],
    };
    const h = new History<Definition>(before);
    h.push(removeFromDefinition(before, new Set(["b"]), new Set()));
    expect(h.present.nodes.map((n) => n.id)).toEqual(["a"]);
    expect(h.present.edges).toHaveLength(1);
    expect(h.undo()).toEqual(before);
  });

  it("keeps at most its limit of steps", () => {
    const h = new History<number>(0, 3);
    for (let i = 1; i <= 10; i++) h.push(i);
    let steps = 0;
    while (h.undo() !== undefined) steps++;
    expect(steps).toBe(3);
    expect(h.present).toBe(7);
  });

  it("starts over on reset", () => {
    const h = new History<number>(0);
    h.push(1);
    h.reset(5);
    expect(h.canUndo).toBe(false);
    expect(h.canRedo).toBe(false);
    expect(h.present).toBe(5);
  });
});
