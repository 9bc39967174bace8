// The shapes the staff API serves (GET /api/v1/node-types/, workflows, runs, memory-view).

export interface NodeTypeSpec {
  name: string;
  category: string;
  description: string;
  config_schema: Record<string, unknown>;
  inputs: string[];
  outputs: string[];
}

export interface DefinitionNode {
  id: string;
  type: string;
  config?: Record<string, unknown>;
  position?: { x: number; y: number };
  label?: string;
}

export interface DefinitionEdge {
  source: string;
  target: string;
  when?: string;
}

export interface Viewport {
  x: number;
  y: number;
  zoom: number;
}

export interface Definition {
  nodes: DefinitionNode[];
  edges: DefinitionEdge[];
  layout?: { viewport?: Viewport };
}

export interface Workflow {
  slug: string;
  name: string;
  description?: string;
  definition: Definition;
  is_active?: boolean;
  version: number;
  [key: string]: unknown;
}

/** Where the server says a definition is wrong: any of node, edge and field may be null. */
export interface ValidationError {
  node: string | null;
  edge: number | null;
  field: string | null;
  message: string;
  /** Found here by the schema (the form shows those itself), not named by the server. */
  local?: boolean;
}

export interface MemoryHit {
  kind: string;
  text: string;
  score: number;
}

export interface MemoryWrite {
  kind: string;
  action: string;
  id: number | string | null;
  key?: string | null;
  admin_url?: string | null;
}

export interface NodeMemory {
  hits?: MemoryHit[];
  scopes?: Record<string, string>;
  writes?: MemoryWrite[];
}

export interface RunEvent {
  event: string;
  data: Record<string, unknown>;
}

export interface WorkflowRun {
  id: number;
  workflow_version?: number;
  trigger?: unknown;
  input?: unknown;
  events?: RunEvent[];
  reply?: string;
  errors?: unknown;
  status: string;
  started_at?: string;
  finished_at?: string | null;
  duration_ms?: number | null;
}

export interface MemoryFact {
  id: number;
  key: string;
  value: unknown;
  admin_url?: string;
  [key: string]: unknown;
}

export interface MemoryView {
  user: Record<string, unknown> | null;
  facts: Record<string, MemoryFact[]>;
  episodes: Record<string, unknown>[];
  procedures: Record<string, unknown>[];
}
