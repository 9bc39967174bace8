// A run's events (streamed, or kept in a run record) folded into what the canvas and panels show.
import type { NodeRunState } from "./nodes";
import type { NodeMemory } from "./types";

export interface RunView {
  runId: number | string | null;
  nodes: Record<string, NodeRunState>;
  status: string | null;
  reply: string | null;
  errors: unknown;
  startedAt: number | null;
  firstNodeEventAt: number | null;
}

export function emptyRun(): RunView {
  return { runId: null, nodes: {}, status: null, reply: null, errors: null, startedAt: null, firstNodeEventAt: null };
}

/** One event (as streamed: {event, data}; or as a run record may keep it: {type, ...data}). */
export function normaliseEvent(raw: unknown): { event: string; data: Record<string, unknown> } | null {
  if (!raw || typeof raw !== "object") return null;
  const record = raw as Record<string, unknown>;
  if (typeof record.event === "string") {
    const data = record.data && typeof record.data === "object" ? (record.data as Record<string, unknown>) : {};
    return { event: record.event, data };
  }
  if (typeof record.type === "string") {
    const { type, ...data } = record;
    return { event: type as string, data };
  }
  return null;
}

export function applyEvent(view: RunView, raw: unknown, now: number = performance.now()): RunView {
  const parsed = normaliseEvent(raw);
  if (!parsed) return view;
  const { event, data } = parsed;
  const node = typeof data.node === "string" ? data.node : null;
  switch (event) {
    case "run_started":
      return { ...emptyRun(), runId: (data.run_id as number) ?? null, status: "running", startedAt: now };
    case "node_started":
      if (!node) return view;
      return {
        ...view,
        firstNodeEventAt: view.firstNodeEventAt ?? now,
        nodes: { ...view.nodes, [node]: { ...view.nodes[node], status: "running", input: data.input } },
      };
    case "node_finished":
      if (!node) return view;
      return {
        ...view,
        firstNodeEventAt: view.firstNodeEventAt ?? now,
        nodes: {
          ...view.nodes,
          [node]: {
            ...view.nodes[node],
            status: "done",
            output: data.output,
            durationMs: typeof data.duration_ms === "number" ? data.duration_ms : undefined,
            memory: (data.memory as NodeMemory) ?? undefined,
          },
        },
      };
    case "node_error":
      if (!node) return view;
      return {
        ...view,
        firstNodeEventAt: view.firstNodeEventAt ?? now,
        nodes: { ...view.nodes, [node]: { ...view.nodes[node], status: "error", error: String(data.error ?? "failed") } },
      };
    case "run_finished":
      return {
        ...view,
        runId: (data.run_id as number) ?? view.runId,
        status: String(data.status ?? "finished"),
        reply: typeof data.reply === "string" ? data.reply : view.reply,
        errors: data.errors ?? null,
      };
    default:
      return view;
  }
}
