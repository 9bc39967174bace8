// The builder: palette, canvas, inspector, run and memory panels over the staff API.
import {
  Background,
  Controls,
  MiniMap,
  ReactFlow,
  ReactFlowProvider,
  applyNodeChanges,
  useReactFlow,
  type Connection,
  type Edge,
  type Node,
  type NodeChange,
  type EdgeChange,
} from "@xyflow/react";
import { useCallback, useEffect, useMemo, useRef, useState } from "react";

import { loadForms, trustLoaded, useValidation } from "./validation";
import {
  ApiError,
  StaleWorkflow,
  createWorkflow,
  deleteRun,
  getNodeTypes,
  getRun,
  getWorkflow,
  listRuns,
  listWorkflows,
  memoryView,
  saveWorkflow,
} from "./api";
import {
  END,
  START,
  comparable,
  emptyDefinition,
  freeNodeId,
  parseImport,
  removeFromDefinition,
  terminalPositions,
  toFlowEdges,
  toFlowNodes,
  withPositions,
  type Overlay,
} from "./graph";
import { History } from "./history";
import { nodeTypes } from "./nodes";
import { reconcileEdges, reconcileNodes, selectOnly, useFitting } from "./canvas";
import { DRAG_MIME, Palette } from "./Palette";
import { slugify, errorText, download } from "./util";
import { EdgeInspector, Inspector, MemoryPanel, RunPanel, RunsList, StaleDialog, type RunForm } from "./panels";
import { applyEvent, emptyRun, type RunView } from "./runState";
import { streamRun } from "./sse";
import { useShortcuts } from "./shortcuts";
import { templates } from "./templates";
import { Topbar } from "./Topbar";
import type { Definition, MemoryView, NodeTypeSpec, Workflow, WorkflowRun } from "./types";


// Props of the canvas that never change, defined once so it never sees them as new.
const DELETE_KEYS = ["Delete", "Backspace"];
const PRO_OPTIONS = { hideAttribution: true };
const MIN_ZOOM = 0.1;

interface Draft extends Workflow {
  draft?: boolean;
}

function Builder() {
  const flow = useReactFlow();
  const [types, setTypes] = useState<NodeTypeSpec[]>([]);
  const specs = useMemo(() => new Map(types.map((t) => [t.name, t])), [types]);
  const [workflows, setWorkflows] = useState<Workflow[]>([]);
  const [workflow, setWorkflow] = useState<Draft | null>(null);
  const history = useRef(new History<Definition>(emptyDefinition()));
  const [definition, setDefinition] = useState<Definition>(emptyDefinition());
  const [historyTick, setHistoryTick] = useState(0);
  const terminals = useRef(terminalPositions(emptyDefinition()));
  const [flowNodes, setFlowNodes] = useState<Node[]>([]);
  const [selectedEdges, setSelectedEdges] = useState<Set<string>>(new Set());
  const [toast, setToast] = useState<{ text: string; undo?: boolean; error?: boolean } | null>(null);
  const [stale, setStale] = useState<Workflow | null>(null);
  const [saving, setSaving] = useState(false);
  const [run, setRun] = useState<RunView>(emptyRun());
  const [running, setRunning] = useState(false);
  const [runs, setRuns] = useState<WorkflowRun[]>([]);
  const [memory, setMemory] = useState<MemoryView | null>(null);
  const [memoryError, setMemoryError] = useState<string | null>(null);
  const [runForm, setRunForm] = useState<RunForm>({ message: "", channel: "telegram", external_id: "42", display_name: "", conversation_id: "" });
  const [loadError, setLoadError] = useState<string | null>(null);
  const wrapper = useRef<HTMLDivElement>(null);
  const specsRef = useRef(specs);
  specsRef.current = specs;
  const fitSoon = useFitting(flow, wrapper, specsRef, terminals, () => history.current.present, flowNodes);

  const say = useCallback((text: string, options: { undo?: boolean; error?: boolean } = {}) => setToast({ text, ...options }), []);

  // ------------------------------------------------------------ history
  const commit = useCallback((next: Definition) => {
    if (history.current.push(next)) {
      setDefinition(next);
      setHistoryTick((t) => t + 1);
    }
  }, []);
  const undo = useCallback(() => {
    const previous = history.current.undo();
    if (previous) {
      setDefinition(previous);
      setHistoryTick((t) => t + 1);
    }
  }, []);
  const redo = useCallback(() => {
    const next = history.current.redo();
    if (next) {
      setDefinition(next);
      setHistoryTick((t) => t + 1);
    }
  }, []);

  const flowEdges = useMemo(() => toFlowEdges(definition, specs, selectedEdges), [definition, specs, selectedEdges]);

  // ------------------------------------------------------------ loading
  const loadWorkflow = useCallback(
    async (slug: string) => {
      try {
        const loaded = await getWorkflow(slug);
        const def = trustLoaded(withPositions(loaded.definition));
        terminals.current = terminalPositions(def);
        history.current.reset(def);
        setDefinition(def);
        setHistoryTick((t) => t + 1);
        // The positions given to nodes that had none are not an edit: compare against them.
        setWorkflow({ ...loaded, definition: def });
        setRun(emptyRun());
        setMemory(null);
        setLoadError(null);
        const url = new URL(window.location.href);
        url.searchParams.set("workflow", slug);
        window.history.replaceState(null, "", url);
        const viewport = def.layout?.viewport;
        if (viewport) {
          // Before the nodes are drawn (they are drawn once, where they stay); again on the next frame
          // in case the canvas was not ready to move yet.
          flow.setViewport(viewport);
          requestAnimationFrame(() => flow.setViewport(viewport));
        }
        else fitSoon(def);
        listRuns(slug)
          .then((rows) => {
            setRuns(rows);
            // The last run's node states come back after a reload.
            if (rows.length) openRun(rows[0]);
          })
          .catch(() => setRuns([]));
      } catch (error) {
        setLoadError(`Could not open workflow ${slug}: ${(error as Error).message}`);
      }
    },
    // eslint-disable-next-line react-hooks/exhaustive-deps
    [flow, fitSoon],
  );

  useEffect(() => {
    (async () => {
      try {
        const [nodeTypesList, workflowList] = await Promise.all([getNodeTypes(), listWorkflows()]);
        setTypes(nodeTypesList);
        specsRef.current = new Map(nodeTypesList.map((t) => [t.name, t]));
        setWorkflows(workflowList);
        const wanted = new URL(window.location.href).searchParams.get("workflow");
        const slug = wanted ?? workflowList[0]?.slug;
        if (slug) await loadWorkflow(slug);
        else newWorkflow("My workflow");
      } catch (error) {
        if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
          window.location.href = `/memories/login/?next=${encodeURIComponent(window.location.pathname + window.location.search)}`;
          return;
        }
        setLoadError(`Could not load the builder: ${(error as Error).message}`);
      }
    })();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, []);

  const newWorkflow = useCallback((name: string, from?: Definition) => {
    const def = withPositions(from ? structuredClone(from) : emptyDefinition());
    terminals.current = terminalPositions(def);
    history.current.reset(def);
    setDefinition(def);
    setHistoryTick((t) => t + 1);
    setWorkflow({ slug: slugify(name), name, definition: emptyDefinition(), version: 0, draft: true });
    setRun(emptyRun());
    setRuns([]);
    setMemory(null);
    const url = new URL(window.location.href);
    url.searchParams.delete("workflow");
    window.history.replaceState(null, "", url);
    // An empty canvas at scale 1: fitting START and END alone would zoom in on them.
    if (def.nodes.length) fitSoon(def);
    else requestAnimationFrame(() => flow.setViewport({ x: 0, y: 0, zoom: 1 }));
  }, [flow, fitSoon]);

  const { errors, validationNote, saving: validationSaving, saved: validationSaved } = useValidation(definition, specs, types.length > 0);

  const overlay: Overlay = useMemo(() => {
    const byNode: Record<string, string[]> = {};
    for (const e of errors) if (e.node) (byNode[e.node] ??= []).push(e.field ? `${e.field}: ${e.message}` : e.message);
    return { runs: run.nodes, errors: byNode };
  }, [errors, run.nodes]);

  // The canvas follows the definition, the run and the errors (keeping what is selected); only the
  // nodes whose drawing changed get new objects, so only they re-render.
  useEffect(() => {
    setFlowNodes((previous) => {
      const selected = new Set(previous.filter((n) => n.selected).map((n) => n.id));
      return reconcileNodes(previous, toFlowNodes(definition, specs, terminals.current, selected, overlay));
    });
  }, [definition, specs, overlay]);

  const shownEdges = useRef<Edge[]>([]);
  const displayedEdges = useMemo(() => {
    const bad = new Set(errors.filter((e) => e.edge !== null && e.edge !== undefined).map((e) => e.edge as number));
    const next = flowEdges.map((edge) => {
      const index = (edge.data as { index: number }).index;
      const running = run.nodes[edge.source]?.status === "done" && run.nodes[edge.target];
      return { ...edge, className: [bad.has(index) ? "invalid" : "", running ? "ran" : ""].filter(Boolean).join(" "), animated: Boolean(running && run.status === "running") };
    });
    shownEdges.current = reconcileEdges(shownEdges.current, next);
    return shownEdges.current;
  }, [flowEdges, errors, run]);

  // Serialising the definition is the costly part of this comparison: once per edit, not per render.
  const dirty = useMemo(
    () => (workflow ? Boolean(workflow.draft) || comparable(definition) !== comparable(workflow.definition) : false),
    [workflow, definition],
  );
  const blocked = errors.length ? `${errors.length} problem${errors.length > 1 ? "s" : ""}: ${errorText(errors[0])}` : !workflow ? "no workflow open" : null;

  useEffect(() => {
    const warn = (event: BeforeUnloadEvent) => {
      if (dirty) event.preventDefault();
    };
    window.addEventListener("beforeunload", warn);
    return () => window.removeEventListener("beforeunload", warn);
  }, [dirty]);

  // ------------------------------------------------------------ editing
  const addNode = useCallback(
    async (spec: NodeTypeSpec, position?: { x: number; y: number }) => {
      const { defaultConfig } = await loadForms();
      const current = history.current.present;
      const id = freeNodeId(current, spec.name);
      const at = position ?? { x: 80 + current.nodes.length * 40, y: 80 + current.nodes.length * 40 };
      commit({ ...current, nodes: [...current.nodes, { id, type: spec.name, config: defaultConfig(spec.config_schema), position: at }] });
      setFlowNodes((nodes) => selectOnly(nodes, new Set([id])));
    },
    [commit],
  );

  const onDrop = useCallback(
    (event: React.DragEvent) => {
      event.preventDefault();
      const name = event.dataTransfer.getData(DRAG_MIME);
      const spec = specs.get(name);
      if (!spec) return;
      const position = flow.screenToFlowPosition({ x: event.clientX, y: event.clientY });
      addNode(spec, { x: Math.round(position.x - 90), y: Math.round(position.y - 20) });
    },
    [flow, specs, addNode],
  );

  const onNodesChange = useCallback(
    (changes: NodeChange[]) => {
      // Deletions go through onDelete (undoable). Sizes come with the nodes (geometry.ts), not from here.
      const kept = changes.filter((c) => c.type !== "remove" && c.type !== "dimensions");
      if (kept.length) setFlowNodes((nodes) => applyNodeChanges(kept, nodes));
      const moved = kept.filter((c) => c.type === "position" && c.dragging === false && c.position);
      if (moved.length) {
        const current = history.current.present;
        const positions = new Map<string, { x: number; y: number }>();
        for (const c of moved) if (c.type === "position" && c.position) positions.set(c.id, { x: Math.round(c.position.x), y: Math.round(c.position.y) });
        if (positions.has(START)) terminals.current = { ...terminals.current, start: positions.get(START)! };
        if (positions.has(END)) terminals.current = { ...terminals.current, end: positions.get(END)! };
        commit({ ...current, nodes: current.nodes.map((n) => (positions.has(n.id) ? { ...n, position: positions.get(n.id) } : n)) });
      }
    },
    [commit],
  );

  const onEdgesChange = useCallback((changes: EdgeChange[]) => {
    const selects = changes.filter((c) => c.type === "select");
    if (selects.length)
      setSelectedEdges((previous) => {
        const next = new Set(previous);
        for (const c of selects) if (c.type === "select") (c.selected ? next.add(c.id) : next.delete(c.id));
        return next;
      });
  }, []);

  const deleteElements = useCallback(
    (nodeIds: Set<string>, edgeIds: Set<string>) => {
      const current = history.current.present;
      nodeIds.delete(START);
      nodeIds.delete(END);
      const edgeIndexes = new Set(flowEdges.filter((e) => edgeIds.has(e.id)).map((e) => (e.data as { index: number }).index));
      if (!nodeIds.size && !edgeIndexes.size) return;
      commit(removeFromDefinition(current, nodeIds, edgeIndexes));
      setSelectedEdges(new Set());
      const parts = [nodeIds.size ? `${nodeIds.size} node${nodeIds.size > 1 ? "s" : ""}` : "", edgeIndexes.size ? `${edgeIndexes.size} edge${edgeIndexes.size > 1 ? "s" : ""}` : ""];
      say(`Deleted ${parts.filter(Boolean).join(" and ")}.`, { undo: true });
    },
    [commit, flowEdges, say],
  );

  const onDelete = useCallback(
    ({ nodes, edges }: { nodes: Node[]; edges: Edge[] }) => deleteElements(new Set(nodes.map((n) => n.id)), new Set(edges.map((e) => e.id))),
    [deleteElements],
  );

  const onConnect = useCallback(
    (connection: Connection) => {
      const current = history.current.present;
      if (connection.source === connection.target) return;
      if (current.edges.some((e) => e.source === connection.source && e.target === connection.target && !e.when)) return;
      commit({ ...current, edges: [...current.edges, { source: connection.source, target: connection.target }] });
    },
    [commit],
  );

  const selectedNodeIds = useMemo(() => new Set(flowNodes.filter((n) => n.selected && n.type === "step").map((n) => n.id)), [flowNodes]);
  const selectedNode = selectedNodeIds.size === 1 ? definition.nodes.find((n) => selectedNodeIds.has(n.id)) : undefined;
  const selectedEdgeIndex = selectedEdges.size === 1 && !selectedNode ? (flowEdges.find((e) => selectedEdges.has(e.id))?.data as { index: number } | undefined)?.index : undefined;

  const updateNode = useCallback(
    (id: string, change: (node: Definition["nodes"][number]) => Definition["nodes"][number]) => {
      const current = history.current.present;
      commit({ ...current, nodes: current.nodes.map((n) => (n.id === id ? change(n) : n)) });
    },
    [commit],
  );

  // ------------------------------------------------------------ save
  const save = useCallback(
    async (force?: Workflow): Promise<Workflow | null> => {
      const target = force ?? workflow;
      if (!target) return null;
      const viewport = flow.getViewport();
      const present = history.current.present;
      const def: Definition = { ...present, layout: { ...present.layout, viewport: { x: Math.round(viewport.x), y: Math.round(viewport.y), zoom: Number(viewport.zoom.toFixed(3)) } } };
      setSaving(true);
      validationSaving(present); // one request: the save checks the definition itself
      let accepted = false;
      try {
        let saved: Workflow;
        if ((target as Draft).draft) {
          saved = await createWorkflow({ slug: target.slug, name: target.name, definition: def });
          setWorkflows((list) => [...list, saved]);
          const url = new URL(window.location.href);
          url.searchParams.set("workflow", saved.slug);
          window.history.replaceState(null, "", url);
        } else {
          saved = await saveWorkflow(target, { definition: def });
        }
        accepted = true;
        setWorkflow(saved);
        say(`Saved version ${saved.version}.`);
        return saved;
      } catch (error) {
        if (error instanceof StaleWorkflow) setStale(error.current);
        else say(`Not saved: ${(error as Error).message}`, { error: true });
        return null;
      } finally {
        setSaving(false);
        validationSaved(present, accepted);
      }
    },
    [workflow, flow, say, validationSaving, validationSaved],
  );

  // ------------------------------------------------------------ runs
  const refreshMemory = useCallback(async () => {
    if (!workflow || workflow.draft) return;
    try {
      setMemory(await memoryView(workflow.slug, { channel: runForm.channel, external_id: runForm.external_id, conversation_id: runForm.conversation_id || undefined }));
      setMemoryError(null);
    } catch (error) {
      setMemoryError((error as Error).message);
    }
  }, [workflow, runForm]);

  const openRun = useCallback(async (row: WorkflowRun) => {
    try {
      const full = row.events ? row : await getRun(row.id);
      let view = emptyRun();
      for (const event of full.events ?? []) view = applyEvent(view, event);
      setRun({ ...view, runId: full.id, status: full.status ?? view.status, reply: full.reply ?? view.reply, errors: full.errors ?? view.errors });
    } catch (error) {
      say(`Could not open run ${row.id}: ${(error as Error).message}`, { error: true });
    }
  }, [say]);

  const startRun = useCallback(async () => {
    if (!workflow || running) return;
    let target: Workflow | null = workflow;
    if (dirty) target = await save();
    if (!target) return;
    setRunning(true);
    setRun({ ...emptyRun(), status: "starting" });
    const body = {
      message: runForm.message,
      channel: runForm.channel,
      external_id: runForm.external_id,
      ...(runForm.display_name ? { display_name: runForm.display_name } : {}),
      ...(runForm.conversation_id ? { conversation_id: runForm.conversation_id } : {}),
    };
    try {
      let firstNodeEvent = true;
      await streamRun(target.slug, body, (event) => {
        // Standard performance marks, so a benchmark (or the browser's profiler) can time the stream.
        if (event.event === "run_started") performance.mark("engram:run_started");
        else if (firstNodeEvent && event.event.startsWith("node_")) {
          firstNodeEvent = false;
          performance.mark("engram:first_node_event");
        }
        setRun((view) => applyEvent(view, event));
      });
    } catch (error) {
      setRun((view) => ({ ...view, status: "failed", errors: [(error as Error).message] }));
    } finally {
      setRunning(false);
      listRuns(target.slug).then(setRuns).catch(() => undefined);
      refreshMemory();
    }
  }, [workflow, running, dirty, save, runForm, refreshMemory]);

  useShortcuts({ save, startRun, undo, redo, blocked, selectedNodeIds, commit, deleteElements, say, present: () => history.current.present, select: (ids) => setFlowNodes((nodes) => selectOnly(nodes, ids)) });

  // ------------------------------------------------------------ import / export / templates
  const onImport = async (file: File) => {
    try {
      const { definition: imported } = parseImport(await file.text());
      const def = withPositions(imported);
      commit(def);
      fitSoon(def);
      say(`Imported ${file.name} (undo to go back).`, { undo: true });
    } catch (error) {
      say(`Not imported: ${(error as Error).message}`, { error: true });
    }
  };

  const onExport = () => {
    if (!workflow) return;
    download(`${workflow.slug}.json`, JSON.stringify({ name: workflow.name, slug: workflow.slug, definition: history.current.present }, null, 2));
  };

  const onTemplate = (id: string) => {
    const template = templates.find((t) => t.id === id);
    if (!template) return;
    newWorkflow(template.name, template.definition);
  };

  void historyTick; // re-render on history moves (canUndo / canRedo)

  if (loadError && !workflow) return <div className="fatal">{loadError}</div>;

  return (
    <div className="app">
      <Topbar
        workflow={workflow}
        workflows={workflows}
        dirty={dirty}
        saving={saving}
        canUndo={history.current.canUndo}
        canRedo={history.current.canRedo}
        onOpen={loadWorkflow}
        onNew={(name) => newWorkflow(name)}
        onTemplate={onTemplate}
        onUndo={undo}
        onRedo={redo}
        onImport={onImport}
        onExport={onExport}
        onSave={() => save()}
      />
      <div className="main">
        <Palette types={types} onAdd={(spec) => addNode(spec)} />
        <div className="canvas" ref={wrapper} onDragOver={(e) => { e.preventDefault(); e.dataTransfer.dropEffect = "copy"; }} onDrop={onDrop}>
          <ReactFlow
              nodes={flowNodes}
              edges={displayedEdges}
              nodeTypes={nodeTypes}
              onNodesChange={onNodesChange}
              onEdgesChange={onEdgesChange}
              onConnect={onConnect}
              onDelete={onDelete}
              deleteKeyCode={DELETE_KEYS}
              onlyRenderVisibleElements
              minZoom={MIN_ZOOM}
              proOptions={PRO_OPTIONS}
            >
              <Background />
              <Controls />
              <MiniMap pannable zoomable />
            </ReactFlow>
          <div className="problems" data-testid="problems">
            {validationNote ? <p className="muted">{validationNote}</p> : null}
            {errors.filter((e) => !e.node).map((e, i) => (
              <p key={i} className="error">
                {errorText(e)}
              </p>
            ))}
          </div>
          {toast ? (
            <div className={`toast ${toast.error ? "error" : ""}`} role="status">
              {toast.text}
              {toast.undo ? (
                <button className="link" onClick={() => { undo(); setToast(null); }}>
                  Undo
                </button>
              ) : null}
              <button className="link" aria-label="Dismiss" onClick={() => setToast(null)}>
                ×
              </button>
            </div>
          ) : null}
        </div>
        <aside className="side">
          {selectedNode ? (
            <Inspector
              node={selectedNode}
              spec={specs.get(selectedNode.type)}
              errors={errors.filter((e) => e.node === selectedNode.id)}
              run={run.nodes[selectedNode.id]}
              onConfig={(config) => updateNode(selectedNode.id, (n) => ({ ...n, config }))}
              onLabel={(label) => updateNode(selectedNode.id, (n) => (label ? { ...n, label } : (({ label: _l, ...rest }) => rest)(n)))}
              onDelete={() => deleteElements(new Set([selectedNode.id]), new Set())}
            />
          ) : selectedEdgeIndex !== undefined ? (
            <EdgeInspector
              edge={definition.edges[selectedEdgeIndex]}
              errors={errors.filter((e) => e.edge === selectedEdgeIndex)}
              onWhen={(when) => {
                const current = history.current.present;
                const edges = current.edges.map((edge, i) => (i === selectedEdgeIndex ? (when ? { ...edge, when } : { source: edge.source, target: edge.target }) : edge));
                commit({ ...current, edges });
              }}
            />
          ) : (
            <p className="muted hint">Drag node types from the palette, connect an output to an input, click a node to configure it. Ctrl+Z / Ctrl+Shift+Z undo and redo, Ctrl+C / Ctrl+V copy and paste nodes as JSON, Del deletes, Ctrl+S saves, Ctrl+Enter runs.</p>
          )}
          <RunPanel form={runForm} onForm={setRunForm} onRun={startRun} blocked={blocked} running={running} reply={run.reply} status={run.status} runErrors={run.errors} dirty={dirty} />
          <MemoryPanel view={memory} error={memoryError} onRefresh={refreshMemory} />
          <RunsList
            runs={runs}
            activeId={typeof run.runId === "number" ? run.runId : null}
            onOpen={openRun}
            onDelete={async (row) => {
              if (!window.confirm(`Delete run #${row.id}?`)) return;
              try {
                await deleteRun(row.id);
                setRuns((list) => list.filter((r) => r.id !== row.id));
              } catch (error) {
                say(`Run not deleted: ${(error as Error).message}`, { error: true });
              }
            }}
          />
        </aside>
      </div>
      {stale ? (
        <StaleDialog
          mine={history.current.present}
          current={stale}
          onClose={() => setStale(null)}
          onKeepMine={() => {
            const base = { ...(workflow as Workflow), version: stale.version };
            setStale(null);
            save(base);
          }}
          onTakeTheirs={() => {
            const theirs = withPositions(stale.definition);
            commit(theirs);
            setWorkflow(stale);
            setStale(null);
            say(`Loaded version ${stale.version}; undo brings yours back.`, { undo: true });
          }}
        />
      ) : null}
    </div>
  );
}

export function App() {
  return (
    <ReactFlowProvider>
      <Builder />
    </ReactFlowProvider>
  );
}
