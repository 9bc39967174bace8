// The top bar: which workflow, new, templates, undo/redo, import/export, save state.
import { useRef } from "react";
import { templates } from "./templates";
import type { Workflow } from "./types";

interface Props {
  workflow: (Workflow & { draft?: boolean }) | null;
  workflows: Workflow[];
  dirty: boolean;
  saving: boolean;
  canUndo: boolean;
  canRedo: boolean;
  onOpen: (slug: string) => void;
  onNew: (name: string) => void;
  onTemplate: (id: string) => void;
  onUndo: () => void;
  onRedo: () => void;
  onImport: (file: File) => void;
  onExport: () => void;
  onSave: () => void;
}

export function Topbar({ workflow, workflows, dirty, saving, canUndo, canRedo, onOpen, onNew, onTemplate, onUndo, onRedo, onImport, onExport, onSave }: Props) {
  const fileInput = useRef<HTMLInputElement>(null);
  return (
    <header className="topbar">
      <strong className="brand">Engram builder</strong>
      <select
        aria-label="Workflow"
        value={workflow && !workflow.draft ? workflow.slug : ""}
        onChange={(e) => {
          if (dirty && !window.confirm("Discard unsaved changes?")) return;
          if (e.target.value) onOpen(e.target.value);
        }}
      >
        {workflow?.draft ? <option value="">{workflow.name} (new, unsaved)</option> : null}
        {workflows.map((w) => (
          <option key={w.slug} value={w.slug}>
            {w.name || w.slug}
          </option>
        ))}
      </select>
      <button
        onClick={() => {
          if (dirty && !window.confirm("Discard unsaved changes?")) return;
          const name = window.prompt("Name of the new workflow", "My workflow");
          if (name) onNew(name);
        }}
      >
        New
      </button>
      <select aria-label="Start from a template" value="" onChange={(e) => e.target.value && (!dirty || window.confirm("Discard unsaved changes?")) && onTemplate(e.target.value)}>
        <option value="">Templates…</option>
        {templates.map((t) => (
          <option key={t.id} value={t.id} title={t.description}>
            {t.name}
          </option>
        ))}
      </select>
      <span className="sep" />
      <button onClick={onUndo} disabled={!canUndo} title="Undo (Ctrl+Z)">
        Undo
      </button>
      <button onClick={onRedo} disabled={!canRedo} title="Redo (Ctrl+Shift+Z)">
        Redo
      </button>
      <button onClick={() => fileInput.current?.click()}>Import</button>
      <input ref={fileInput} type="file" accept="application/json,.json" hidden aria-label="Import file" onChange={(e) => e.target.files?.[0] && onImport(e.target.files[0])} />
      <button onClick={onExport}>Export</button>
      <span className="sep" />
      <span className={`save-state ${dirty ? "dirty" : "clean"}`} data-testid="save-state">
        {workflow?.draft ? "new, not saved" : dirty ? "unsaved changes" : `saved · v${workflow?.version ?? "?"}`}
      </span>
      <button className="primary" onClick={onSave} disabled={!dirty || saving} title="Save (Ctrl+S)">
        {saving ? "Saving…" : "Save"}
      </button>
      <a className="admin-link" href="/memories/">
        Memories admin
      </a>
    </header>
  );
}
