// Where everything on a node stands, known before it is drawn. The node components lay themselves out
// with these numbers (fixed rows, no wrapping) and each canvas node carries its size and its handles'
// places, so React Flow draws the nodes and their edges in one pass: without them it first draws every
// node hidden, measures each one and each handle in the DOM (a forced layout per node), and only then
// draws the edges and shows the nodes, which made a large workflow slow to open.
import type { NodeHandle } from "@xyflow/react";
import { Position } from "@xyflow/react";

export const STEP_WIDTH = 200;
export const BORDER = 1;
/** The head row (label and type), its bottom border included. */
export const HEAD = 30;
/** One line under the head or the ports: unknown type, an error, the run's state. */
export const NOTE = 20;
export const PORT_ROW = 18;
export const PORTS_MARGIN = 4;
export const HANDLE = 8;
export const TERMINAL = { width: 64, height: 28 };

export interface Geometry {
  width: number;
  height: number;
  handles: NodeHandle[];
}

function handle(type: "source" | "target", id: string, x: number, centreY: number): NodeHandle {
  return {
    id,
    type,
    position: type === "target" ? Position.Left : Position.Right,
    x: x - HANDLE / 2,
    y: centreY - HANDLE / 2,
    width: HANDLE,
    height: HANDLE,
  };
}

/** What a step draws: its ports (inputs left, outputs right, a row each side by side) and its notes. */
export interface StepShape {
  inputs: string[];
  outputs: string[];
  unknownType?: boolean;
  error?: boolean;
  run?: boolean;
}

/** A step's size and handles. */
export function stepGeometry({ inputs, outputs, unknownType, error, run }: StepShape): Geometry {
  const portsTop = BORDER + HEAD + (unknownType ? NOTE : 0) + PORTS_MARGIN;
  const centre = (i: number) => portsTop + i * PORT_ROW + PORT_ROW / 2;
  const handles = [
    ...inputs.map((port, i) => handle("target", port, BORDER, centre(i))),
    ...outputs.map((port, i) => handle("source", port, STEP_WIDTH - BORDER, centre(i))),
  ];
  const rows = Math.max(inputs.length, outputs.length);
  const height = portsTop + rows * PORT_ROW + PORTS_MARGIN + (error ? NOTE : 0) + (run ? NOTE : 0) + BORDER;
  return { width: STEP_WIDTH, height, handles };
}

/** START (one output, on its right) or END (one input, on its left). */
export function terminalGeometry(port: { type: "source" | "target"; id: string }): Geometry {
  const x = port.type === "source" ? TERMINAL.width : 0;
  return { ...TERMINAL, handles: [handle(port.type, port.id, x, TERMINAL.height / 2)] };
}
