// The canvas's node components: a step (any registered type, ports from its inputs and outputs) and
// the definition's START and END. Both are memoised: React Flow hands a node new props only when its
// own object changes (see canvas.ts), and a step's ports re-render only when its type does (or the zoom
// crosses LIVE_HANDLES_ZOOM). Their rows have the fixed heights of geometry.ts (one line each, cut with
// an ellipsis): React Flow is given each node's size and handles from there before it draws it.
import { Handle, Position, useStore, type NodeProps, type ReactFlowState } from "@xyflow/react";
import { memo } from "react";
import { HEAD, NOTE, PORT_ROW, PORTS_MARGIN } from "./geometry";
import { END, GENERIC_IN, GENERIC_OUT, inputHandles, outputHandles, type StepData } from "./graph";
import type { NodeMemory, NodeTypeSpec } from "./types";

export interface NodeRunState {
  status: "running" | "done" | "error";
  input?: unknown;
  output?: unknown;
  durationMs?: number;
  memory?: NodeMemory;
  error?: string;
}

const HEAD_STYLE = { height: HEAD };
const NOTE_STYLE = { height: NOTE, lineHeight: `${NOTE}px` };

// Below this zoom a port is a few pixels wide: too small to drag a connection from, so its handle is
// drawn as a plain dot with React Flow's handle markup (where React Flow finds and measures handles, so
// edges meet it) but none of its connection logic. A live handle subscribes twice to React Flow's store,
// and a large workflow, opened to fit, shows thousands of them at once.
export const LIVE_HANDLES_ZOOM = 0.5;
const liveHandles = (s: ReactFlowState) => s.transform[2] >= LIVE_HANDLES_ZOOM;

function Port({ type, id, row, live }: { type: "source" | "target"; id: string; row: number; live: boolean }) {
  const position = type === "target" ? Position.Left : Position.Right;
  const style = { top: row * PORT_ROW + PORT_ROW / 2 };
  if (live) return <Handle type={type} position={position} id={id} style={style} />;
  return <div className={`react-flow__handle react-flow__handle-${position} ${type}`} data-handleid={id} data-handlepos={position} style={style} />;
}

// A step's ports: each side's names as one block of lines beside its handles (one element per side, not
// one per port: a large workflow draws a few thousand ports).
const Ports = memo(function Ports({ spec }: { spec?: NodeTypeSpec }) {
  const live = useStore(liveHandles);
  const inputs = inputHandles(spec);
  const outputs = outputHandles(spec);
  const rows = Math.max(inputs.length, outputs.length);
  return (
    <div className="ports" style={{ height: rows * PORT_ROW, margin: `${PORTS_MARGIN}px 0`, lineHeight: `${PORT_ROW}px` }}>
      <div className="port-names port-in">{inputs.map((port) => (port === GENERIC_IN ? "" : port)).join("\n")}</div>
      <div className="port-names port-out">{outputs.map((port) => (port === GENERIC_OUT ? "" : port)).join("\n")}</div>
      {inputs.map((port, i) => (
        <Port key={`in-${port}`} type="target" id={port} row={i} live={live} />
      ))}
      {outputs.map((port, i) => (
        <Port key={`out-${port}`} type="source" id={port} row={i} live={live} />
      ))}
    </div>
  );
});

const NO_ERRORS: string[] = [];

export const StepNode = memo(function StepNode({ id, data, selected }: NodeProps) {
  const { node, spec, run, errors = NO_ERRORS } = data as StepData;
  const classes = ["step", selected ? "selected" : "", run ? `run-${run.status}` : "", errors.length ? "invalid" : "", spec ? "" : "unknown"];
  return (
    <div className={classes.filter(Boolean).join(" ")} data-node-id={id} data-status={run?.status ?? ""} title={errors.join("\n") || spec?.description}>
      <div className="step-head" style={HEAD_STYLE}>
        <span className="step-label" title={node.label || node.id}>{node.label || node.id}</span>
        <span className="step-type">{node.type}</span>
      </div>
      {spec ? null : <div className="step-error" style={NOTE_STYLE}>unknown node type</div>}
      <Ports spec={spec} />
      {errors.length ? (
        <div className="step-error" role="alert" style={NOTE_STYLE}>
          {errors[0]}
          {errors.length > 1 ? ` (+${errors.length - 1})` : ""}
        </div>
      ) : null}
      {run ? (
        <div className="step-run" style={NOTE_STYLE}>
          {run.status}
          {run.durationMs !== undefined ? ` · ${Math.round(run.durationMs)} ms` : ""}
        </div>
      ) : null}
    </div>
  );
});

export const TerminalNode = memo(function TerminalNode({ data }: NodeProps) {
  const kind = (data as { kind: string }).kind;
  return (
    <div className={`terminal terminal-${kind.toLowerCase()}`} data-node-id={kind}>
      {kind === END ? <Handle type="target" position={Position.Left} id={GENERIC_IN} /> : null}
      {kind}
      {kind === END ? null : <Handle type="source" position={Position.Right} id={GENERIC_OUT} />}
    </div>
  );
});

export const nodeTypes = { step: StepNode, terminal: TerminalNode };
