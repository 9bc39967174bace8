// Each edit checked: by the server (debounced, POST /api/v1/workflows/validate/) and, at once, by each
// node type's JSON Schema in the page; the server's errors win where both name the same field.
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { validateDefinition } from "./api";
import type { Config } from "./ConfigForm";
import type { Definition, DefinitionNode, NodeTypeSpec, ValidationError } from "./types";

const VALIDATE_DEBOUNCE_MS = 350;

// The forms and their JSON-Schema validator (most of the JavaScript) load after the canvas is drawn.
type FormsModule = typeof import("./ConfigForm");
export const loadForms = () => import("./ConfigForm");

// Nodes as the server sent them: its own check of the opened definition covers them, so the page's
// schema check runs only on nodes edited (or added) since, instead of on the whole graph at load.
const fromServer = new WeakSet<DefinitionNode>();

export function trustLoaded(definition: Definition): Definition {
  for (const node of definition.nodes) fromServer.add(node);
  return definition;
}

// One schema check per node object and type: an edit re-checks the nodes it replaced, no others.
const checked = new WeakMap<DefinitionNode, { spec: NodeTypeSpec; errors: ValidationError[] }>();

function nodeErrors(forms: FormsModule, node: DefinitionNode, spec: NodeTypeSpec): ValidationError[] {
  const hit = checked.get(node);
  if (hit && hit.spec === spec) return hit.errors;
  const errors = forms.configErrors(spec.config_schema, (node.config ?? {}) as Config).map((e) => ({
    node: node.id,
    edge: null,
    field: e.field ? `config.${e.field}` : "config",
    message: e.message,
    local: true,
  }));
  checked.set(node, { spec, errors });
  return errors;
}

const idle: (callback: () => void) => void =
  typeof window !== "undefined" && "requestIdleCallback" in window
    ? (callback) => window.requestIdleCallback(callback, { timeout: 1000 })
    : (callback) => setTimeout(callback, 200);

function sameErrors(a: ValidationError[], b: ValidationError[]): boolean {
  return a.length === b.length && JSON.stringify(a) === JSON.stringify(b);
}

export function useValidation(definition: Definition, specs: Map<string, NodeTypeSpec>, ready: boolean) {
  const [serverErrors, setServerErrors] = useState<ValidationError[]>([]);
  const [validationNote, setValidationNote] = useState<string | null>(null);
  const [forms, setForms] = useState<FormsModule | null>(null);
  useEffect(() => {
    // Not before the page is drawn: parsing the forms' code would delay the first canvas.
    idle(() => loadForms().then(setForms));
  }, []);
  const serverDown = validationNote !== null;
  const localErrors = useMemo(() => {
    const errors: ValidationError[] = [];
    if (!forms) return errors;
    for (const node of definition.nodes) {
      if (!serverDown && fromServer.has(node)) continue;
      const spec = specs.get(node.type);
      if (spec) errors.push(...nodeErrors(forms, node, spec));
    }
    return errors;
  }, [definition, specs, forms, serverDown]);

  // A save is the server's check too (it refuses an invalid definition): while one is sent, the check
  // pending for the same definition is not, and an accepted save clears what the server had named.
  const pending = useRef<{ definition: Definition; cancel: () => void } | null>(null);
  const [recheckTick, setRecheckTick] = useState(0);
  const saving = useCallback((sent: Definition) => {
    if (pending.current?.definition === sent) {
      pending.current.cancel();
      pending.current = null;
    }
  }, []);
  const latest = useRef(definition);
  latest.current = definition;
  const saved = useCallback((sent: Definition, accepted: boolean) => {
    if (sent !== latest.current) return; // edited since: the newer definition's own check is pending
    if (!accepted) setRecheckTick((t) => t + 1);
    else {
      setServerErrors((previous) => (previous.length ? [] : previous));
      setValidationNote(null);
    }
  }, []);

  useEffect(() => {
    if (!ready) return;
    const controller = new AbortController();
    const cancel = () => {
      clearTimeout(timer);
      controller.abort();
    };
    pending.current = { definition, cancel };
    // After the pause in editing, and once the page is idle: a workflow just opened is drawn first (the
    // server's check of a large one takes the CPU a 2-core machine is drawing it with).
    const timer = setTimeout(() => idle(check), VALIDATE_DEBOUNCE_MS);
    const check = async () => {
      if (controller.signal.aborted) return;
      try {
        const result = await validateDefinition(definition, controller.signal);
        if (pending.current?.definition === definition) pending.current = null;
        // The same answer again keeps the same list, so nothing downstream re-renders.
        setServerErrors((previous) => (sameErrors(previous, result.errors) ? previous : result.errors));
        setValidationNote(null);
      } catch (error) {
        if (controller.signal.aborted) return;
        setServerErrors((previous) => (previous.length ? [] : previous));
        setValidationNote(`The server could not check this definition (${(error as Error).message}); config forms are still checked here.`);
      }
    };
    return cancel;
  }, [definition, ready, recheckTick]);

  const errors = useMemo(() => {
    // The server's errors, plus the schema's own for fields it has not (yet) named.
    const seen = new Set(serverErrors.map((e) => `${e.node}|${e.field}`));
    return [...serverErrors, ...localErrors.filter((e) => !seen.has(`${e.node}|${e.field}`))];
  }, [serverErrors, localErrors]);
  return { errors, validationNote, saving, saved };
}
