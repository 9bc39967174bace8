// The side panels: the selected node's inspector (config form and last run), the run panel, the
// memory panel and the list of past runs; and the stale-save dialog.
import { Suspense, lazy } from "react";
import type { Config } from "./ConfigForm";
import { describeDifferences } from "./graph";
import type { NodeRunState } from "./nodes";
import type { Definition, DefinitionEdge, DefinitionNode, MemoryView, NodeTypeSpec, ValidationError, Workflow, WorkflowRun } from "./types";

const ConfigForm = lazy(() => import("./ConfigForm").then((m) => ({ default: m.ConfigForm })));

function Json({ value }: { value: unknown }) {
  return <pre className="json">{value === undefined ? "—" : JSON.stringify(value, null, 2)}</pre>;
}

export function MemoryOfNode({ run }: { run: NodeRunState }) {
  const memory = run.memory;
  if (!memory) return null;
  return (
    <div className="node-memory">
      {memory.hits ? (
        <>
          <h4>Recalled ({memory.hits.length})</h4>
          <table className="hits">
            <tbody>
              {memory.hits.map((hit, i) => (
                <tr key={i}>
                  <td className={`kind kind-${hit.kind}`}>{hit.kind}</td>
                  <td>{hit.text}</td>
                  <td className="num">{typeof hit.score === "number" ? hit.score.toFixed(3) : ""}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      ) : null}
      {memory.scopes && Object.keys(memory.scopes).length ? (
        <>
          <h4>Winning scope per fact key</h4>
          <ul className="scopes">
            {Object.entries(memory.scopes).map(([key, scope]) => (
              <li key={key}>
                <code>{key}</code> <span className={`scope scope-${scope}`}>{scope}</span>
              </li>
            ))}
          </ul>
        </>
      ) : null}
      {memory.writes ? (
        <>
          <h4>Written ({memory.writes.length})</h4>
          <ul className="writes">
            {memory.writes.map((write, i) => (
              <li key={i}>
                <span className={`action action-${write.action}`}>{write.action}</span> {write.kind}
                {write.key ? <code> {write.key}</code> : null}{" "}
                {write.admin_url ? (
                  <a href={write.admin_url} target="_blank" rel="noreferrer">
                    open #{write.id}
                  </a>
                ) : write.id != null ? (
                  `#${write.id}`
                ) : null}
              </li>
            ))}
          </ul>
        </>
      ) : null}
    </div>
  );
}

interface InspectorProps {
  node: DefinitionNode;
  spec?: NodeTypeSpec;
  errors: ValidationError[];
  run?: NodeRunState;
  onConfig: (config: Config) => void;
  onLabel: (label: string) => void;
  onDelete: () => void;
}

export function Inspector({ node, spec, errors, run, onConfig, onLabel, onDelete }: InspectorProps) {
  const fieldErrors = errors.filter((e) => e.field && !e.local);
  const otherErrors = errors.filter((e) => !e.field || (e.local && !e.field.startsWith("config")));
  return (
    <section className="inspector" aria-label={`Node ${node.id}`}>
      <header>
        <h2>
          {node.id} <small>{node.type}</small>
        </h2>
        <button className="danger" onClick={onDelete} title="Delete (Del); undo with Ctrl+Z">
          Delete
        </button>
      </header>
      {spec ? <p className="muted">{spec.description}</p> : <p className="error">Unknown node type {node.type}: not registered on this server.</p>}
      <label className="label-field">
        Label
        <input value={node.label ?? ""} placeholder={node.id} onChange={(e) => onLabel(e.target.value)} />
      </label>
      {otherErrors.map((e, i) => (
        <p key={i} className="error" role="alert">
          {e.message}
        </p>
      ))}
      {spec ? (
        <Suspense fallback={<p className="muted">Loading the form…</p>}>
        <ConfigForm
          key={node.id}
          schema={spec.config_schema}
          value={(node.config ?? {}) as Config}
          onChange={onConfig}
          serverErrors={fieldErrors}
          idPrefix={`cfg-${node.id}`}
        />
        </Suspense>
      ) : null}
      {run ? (
        <div className="last-run" data-testid="node-run">
          <h3>
            Last run: <span className={`status-${run.status}`}>{run.status}</span>
            {run.durationMs !== undefined ? ` in ${Math.round(run.durationMs)} ms` : ""}
          </h3>
          {run.error ? <p className="error">{run.error}</p> : null}
          <MemoryOfNode run={run} />
          <details open>
            <summary>Input (the state it read)</summary>
            <Json value={run.input} />
          </details>
          <details open>
            <summary>Output (its update)</summary>
            <Json value={run.output} />
          </details>
        </div>
      ) : null}
    </section>
  );
}

export function EdgeInspector({ edge, errors, onWhen }: { edge: DefinitionEdge; errors: ValidationError[]; onWhen: (when: string) => void }) {
  return (
    <section className="inspector" aria-label="Edge">
      <h2>
        Edge {edge.source} → {edge.target}
      </h2>
      <label className="label-field">
        Only when this state key is truthy (empty: always)
        <input value={edge.when ?? ""} onChange={(e) => onWhen(e.target.value)} />
      </label>
      {errors.map((e, i) => (
        <p key={i} className="error">
          {e.message}
        </p>
      ))}
    </section>
  );
}

export interface RunForm {
  message: string;
  channel: string;
  external_id: string;
  display_name: string;
  conversation_id: string;
}

interface RunPanelProps {
  form: RunForm;
  onForm: (form: RunForm) => void;
  onRun: () => void;
  blocked: string | null;
  running: boolean;
  reply: string | null;
  status: string | null;
  runErrors: unknown;
  dirty: boolean;
}

export function RunPanel({ form, onForm, onRun, blocked, running, reply, status, runErrors, dirty }: RunPanelProps) {
  const set = (field: keyof RunForm) => (e: React.ChangeEvent<HTMLInputElement | HTMLTextAreaElement>) => onForm({ ...form, [field]: e.target.value });
  const label = running ? "Running…" : blocked ? `Can't run: ${blocked}` : dirty ? "Save and run" : "Run";
  return (
    <section className="run-panel" aria-label="Run">
      <h2>Run</h2>
      <textarea aria-label="Message" placeholder="Message" value={form.message} onChange={set("message")} rows={2} />
      <div className="row">
        <label>
          Channel
          <input aria-label="Channel" value={form.channel} onChange={set("channel")} />
        </label>
        <label>
          User id
          <input aria-label="User id" value={form.external_id} onChange={set("external_id")} />
        </label>
      </div>
      <div className="row">
        <label>
          Name
          <input aria-label="Display name" value={form.display_name} onChange={set("display_name")} placeholder="optional" />
        </label>
        <label>
          Conversation
          <input aria-label="Conversation id" value={form.conversation_id} onChange={set("conversation_id")} placeholder="direct" />
        </label>
      </div>
      <button className="primary run-button" disabled={Boolean(blocked) || running || !form.message.trim()} onClick={onRun} title={blocked ?? ""}>
        {label}
      </button>
      {status ? (
        <div className={`run-result status-${status}`} data-testid="run-result">
          <strong>{status}</strong>
          {reply ? <p className="reply">{reply}</p> : null}
          {runErrors && (!Array.isArray(runErrors) || runErrors.length) ? <Json value={runErrors} /> : null}
        </div>
      ) : null}
    </section>
  );
}

export function MemoryPanel({ view, error, onRefresh }: { view: MemoryView | null; error: string | null; onRefresh: () => void }) {
  return (
    <section className="memory-panel" aria-label="Memory">
      <header>
        <h2>Memory the next run sees</h2>
        <button onClick={onRefresh}>Refresh</button>
      </header>
      {error ? <p className="error">{error}</p> : null}
      {!view ? <p className="muted">Run the workflow, or refresh, to see this person's memory.</p> : null}
      {view && !view.user ? <p className="muted">No memory user yet for this channel and id.</p> : null}
      {view?.user ? (
        <p>
          User <strong>{String(view.user.display_name ?? view.user.id ?? "")}</strong>
        </p>
      ) : null}
      {view
        ? Object.entries(view.facts ?? {}).map(([scope, facts]) =>
            facts.length ? (
              <div key={scope} className="fact-scope">
                <h4>{scope} facts</h4>
                <ul>
                  {facts.map((fact) => (
                    <li key={fact.id} className="fact">
                      <code>{fact.key}</code>: {typeof fact.value === "string" ? fact.value : JSON.stringify(fact.value)}{" "}
                      {fact.admin_url ? (
                        <a href={fact.admin_url} target="_blank" rel="noreferrer">
                          open
                        </a>
                      ) : null}
                    </li>
                  ))}
                </ul>
              </div>
            ) : null,
          )
        : null}
      {view?.episodes?.length ? (
        <div>
          <h4>Recent episodes</h4>
          <ul>
            {view.episodes.map((ep, i) => (
              <li key={i}>{String(ep.summary || ep.final_output || ep.trigger_type || `episode ${ep.id}`)}</li>
            ))}
          </ul>
        </div>
      ) : null}
      {view?.procedures?.length ? (
        <div>
          <h4>Matching procedures</h4>
          <ul>
            {view.procedures.map((p, i) => (
              <li key={i}>{String(p.name ?? p.id)}</li>
            ))}
          </ul>
        </div>
      ) : null}
    </section>
  );
}

export function RunsList({ runs, onOpen, onDelete, activeId }: { runs: WorkflowRun[]; onOpen: (run: WorkflowRun) => void; onDelete: (run: WorkflowRun) => void; activeId: number | null }) {
  return (
    <section className="runs" aria-label="Past runs">
      <h2>Past runs</h2>
      {runs.length ? null : <p className="muted">No runs yet.</p>}
      <ul>
        {runs.map((run) => (
          <li key={run.id} className={run.id === activeId ? "active" : ""}>
            <button className="link" onClick={() => onOpen(run)}>
              #{run.id} <span className={`status-${run.status}`}>{run.status}</span> v{run.workflow_version ?? "?"}{" "}
              {run.started_at ? new Date(run.started_at).toLocaleTimeString() : ""}
              {run.duration_ms != null ? ` · ${Math.round(run.duration_ms)} ms` : ""}
            </button>
            <button className="link danger" title="Delete this run" onClick={() => onDelete(run)}>
              ×
            </button>
          </li>
        ))}
      </ul>
    </section>
  );
}

interface StaleProps {
  mine: Definition;
  current: Workflow;
  onKeepMine: () => void;
  onTakeTheirs: () => void;
  onClose: () => void;
}

/** A save refused because someone else saved first: both versions side by side; nothing merged. */
export function StaleDialog({ mine, current, onKeepMine, onTakeTheirs, onClose }: StaleProps) {
  const differences = describeDifferences(mine, current.definition);
  return (
    <div className="modal-backdrop">
      <div className="modal" role="dialog" aria-modal="true" aria-labelledby="stale-title">
        <h2 id="stale-title">This workflow was saved by someone else (now version {current.version})</h2>
        <p>
          Your changes were not saved and nothing was merged. Choose which version to keep; your version stays in the undo history
          either way, and you can export it first.
        </p>
        {differences.length ? (
          <ul className="differences">
            {differences.map((line) => (
              <li key={line}>{line}</li>
            ))}
          </ul>
        ) : (
          <p>The definitions are the same; only the version moved.</p>
        )}
        <div className="versions">
          <div>
            <h3>Yours (unsaved)</h3>
            <Json value={mine} />
          </div>
          <div>
            <h3>Theirs (version {current.version})</h3>
            <Json value={current.definition} />
          </div>
        </div>
        <div className="buttons">
          <button className="primary" onClick={onKeepMine}>
            Keep mine and overwrite theirs
          </button>
          <button onClick={onTakeTheirs}>Load theirs (mine stays in undo)</button>
          <button onClick={onClose}>Decide later</button>
        </div>
      </div>
    </div>
  );
}
