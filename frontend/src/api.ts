// The staff API over the Django session: the `csrftoken` cookie goes back as X-CSRFToken on every
// unsafe request, and nothing is kept in localStorage.
import type { Definition, MemoryView, NodeTypeSpec, ValidationError, Workflow, WorkflowRun } from "./types";

export const API = "/api/v1";

export function csrfToken(cookie: string = document.cookie): string {
  for (const part of cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === "csrftoken") return decodeURIComponent(rest.join("="));
  }
  return "";
}

export class ApiError extends Error {
  status: number;
  body: unknown;
  constructor(status: number, body: unknown, message: string) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

/** A readable sentence out of a DRF error body ({"detail"}, {"field": ["..."]}, ...). */
export function describeError(body: unknown): string {
  if (body && typeof body === "object") {
    const record = body as Record<string, unknown>;
    if (typeof record.detail === "string") return record.detail;
    const parts = Object.entries(record).map(([field, value]) => {
      const text = Array.isArray(value) ? value.map((v) => (typeof v === "string" ? v : JSON.stringify(v))).join(" ") : JSON.stringify(value);
      return `${field}: ${text}`;
    });
    if (parts.length) return parts.join("; ");
  }
  return typeof body === "string" && body ? body.slice(0, 300) : "the server gave no reason";
}

export function requestHeaders(method: string, extra: Record<string, string> = {}): Record<string, string> {
  const headers: Record<string, string> = { Accept: "application/json", ...extra };
  if (method !== "GET" && method !== "HEAD") {
    headers["Content-Type"] = "application/json";
    headers["X-CSRFToken"] = csrfToken();
  }
  return headers;
}

interface Preloaded {
  url: string;
  status: number;
  etag: string | null;
  text: string;
}

/** A GET the page's inline script started before this code loaded (each is used once). */
function preloaded(url: string): Promise<Response> | null {
  const store = (window as unknown as { __engramPreload?: Record<string, Promise<Preloaded>> }).__engramPreload;
  const pending = store?.[url];
  if (!pending) return null;
  delete store![url];
  return pending.then(
    (p) => new Response(p.text || null, { status: p.status, headers: p.etag ? { ETag: p.etag } : {} }),
    () => fetch(url, { credentials: "same-origin", headers: requestHeaders("GET") }),
  );
}

export async function request<T>(
  method: string,
  path: string,
  body?: unknown,
  extraHeaders: Record<string, string> = {},
): Promise<{ data: T; response: Response }> {
  const url = path.startsWith("/") ? path : `${API}/${path}`;
  const response =
    (method === "GET" && preloaded(url)) ||
    (await fetch(url, {
      method,
      credentials: "same-origin",
      headers: requestHeaders(method, extraHeaders),
      body: body === undefined ? undefined : JSON.stringify(body),
    }));
  const resolved = await response;
  const text = await resolved.text();
  let data: unknown = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!resolved.ok) {
    throw new ApiError(resolved.status, data, `${method} ${path}: ${resolved.status} ${describeError(data)}`);
  }
  return { data: data as T, response: resolved };
}

interface Page<T> {
  results: T[];
  next?: string | null;
  count?: number;
}

/** Every row of a paginated list (or a plain list). */
export async function listAll<T>(path: string): Promise<T[]> {
  const rows: T[] = [];
  let url: string | null = path;
  while (url) {
    const { data }: { data: Page<T> | T[] } = await request<Page<T> | T[]>("GET", url);
    if (Array.isArray(data)) return data;
    rows.push(...data.results);
    url = data.next ? new URL(data.next, window.location.href).pathname + new URL(data.next, window.location.href).search : null;
  }
  return rows;
}

export const getNodeTypes = () => request<NodeTypeSpec[]>("GET", "node-types/").then((r) => r.data);

export const listWorkflows = () => listAll<Workflow>(`${API}/workflows/`);

export async function getWorkflow(slug: string): Promise<Workflow> {
  const { data, response } = await request<Workflow>("GET", `workflows/${encodeURIComponent(slug)}/`);
  return withVersion(data, response);
}

function withVersion(data: Workflow, response: Response): Workflow {
  const etag = response.headers.get("ETag");
  if (typeof data.version !== "number" && etag) {
    const parsed = Number(etag.replace(/^W\//, "").replace(/"/g, ""));
    if (Number.isFinite(parsed)) data.version = parsed;
  }
  return data;
}

/** A stale save: the server's current workflow as GET returns it. */
export class StaleWorkflow extends Error {
  current: Workflow;
  constructor(current: Workflow, message: string) {
    super(message);
    this.current = current;
  }
}

export async function saveWorkflow(workflow: Workflow, fields: Partial<Workflow>): Promise<Workflow> {
  try {
    const { data, response } = await request<Workflow>("PATCH", `workflows/${encodeURIComponent(workflow.slug)}/`, fields, {
      "If-Match": `"${workflow.version}"`,
    });
    return withVersion(data, response);
  } catch (error) {
    if (error instanceof ApiError && error.status === 409) {
      const body = error.body as { detail?: string; current?: Workflow };
      if (body?.current) throw new StaleWorkflow(body.current, body.detail ?? "the workflow changed on the server");
    }
    throw error;
  }
}

export async function createWorkflow(fields: Partial<Workflow>): Promise<Workflow> {
  const { data, response } = await request<Workflow>("POST", "workflows/", fields);
  return withVersion(data, response);
}

export async function validateDefinition(definition: Definition, signal?: AbortSignal): Promise<{ valid: boolean; errors: ValidationError[] }> {
  const response = await fetch(`${API}/workflows/validate/`, {
    method: "POST",
    credentials: "same-origin",
    headers: requestHeaders("POST"),
    body: JSON.stringify({ definition }),
    signal,
  });
  const data = await response.json().catch(() => null);
  if (!response.ok || !data || typeof data.valid !== "boolean") {
    throw new ApiError(response.status, data, `validation failed: ${describeError(data)}`);
  }
  return data;
}

export const listRuns = (slug: string) =>
  request<Page<WorkflowRun> | WorkflowRun[]>("GET", `runs/?workflow=${encodeURIComponent(slug)}`).then((r) =>
    Array.isArray(r.data) ? r.data : r.data.results,
  );

export const getRun = (id: number) => request<WorkflowRun>("GET", `runs/${id}/`).then((r) => r.data);

export const deleteRun = (id: number) => request<null>("DELETE", `runs/${id}/`);

export function memoryView(slug: string, params: { channel: string; external_id: string; conversation_id?: string }) {
  const query = new URLSearchParams({ channel: params.channel, external_id: params.external_id });
  if (params.conversation_id) query.set("conversation_id", params.conversation_id);
  return request<MemoryView>("GET", `workflows/${encodeURIComponent(slug)}/memory-view/?${query}`).then((r) => r.data);
}
