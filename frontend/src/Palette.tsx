// The palette: every registered node type, by category, searchable, dragged onto the canvas.
import { useMemo, useState } from "react";
import type { NodeTypeSpec } from "./types";

export const DRAG_MIME = "application/x-engram-node-type";

export function groupTypes(types: NodeTypeSpec[], query: string): [string, NodeTypeSpec[]][] {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  const groups = new Map<string, NodeTypeSpec[]>();
  for (const spec of types) {
    const text = `${spec.name} ${spec.category} ${spec.description}`.toLowerCase();
    if (!words.every((w) => text.includes(w))) continue;
    const list = groups.get(spec.category) ?? [];
    list.push(spec);
    groups.set(spec.category, list);
  }
  return [...groups.entries()].sort(([a], [b]) => a.localeCompare(b));
}

export function Palette({ types, onAdd }: { types: NodeTypeSpec[]; onAdd: (spec: NodeTypeSpec) => void }) {
  const [query, setQuery] = useState("");
  const groups = useMemo(() => groupTypes(types, query), [types, query]);
  return (
    <aside className="palette" aria-label="Node palette">
      <input type="search" placeholder="Search node types" value={query} onChange={(e) => setQuery(e.target.value)} aria-label="Search node types" />
      {groups.length ? null : <p className="muted">No node type matches.</p>}
      {groups.map(([category, specs]) => (
        <section key={category}>
          <h3>{category}</h3>
          {specs.map((spec) => (
            <div
              key={spec.name}
              className="palette-item"
              data-type={spec.name}
              draggable
              title={`${spec.description}\n(drag onto the canvas, or double-click to add)`}
              onDragStart={(event) => {
                event.dataTransfer.setData(DRAG_MIME, spec.name);
                event.dataTransfer.effectAllowed = "copy";
              }}
              onDoubleClick={() => onAdd(spec)}
            >
              <strong>{spec.name}</strong>
              <small>{spec.description}</small>
            </div>
          ))}
        </section>
      ))}
    </aside>
  );
}
