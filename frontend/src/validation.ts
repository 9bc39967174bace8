// Each edit checked: by the server (debounced, POST /api/v1/workflows/validate/) and, at once, by each
// node type's JSON Schema in the page; the server's errors win where both name the same field.
import { useEffect, useMemo, useState } from "react";
import { validateDefinition } from "./api";
import type { Config } from "./ConfigForm";
import type { Definition, NodeTypeSpec, ValidationError } from "./types";

const VALIDATE_DEBOUNCE_MS = 350;

// The forms and their JSON-Schema validator (most of the JavaScript) load after the canvas is drawn.
type FormsModule = typeof import("./ConfigForm");
export const loadForms = () => import("./ConfigForm");

export function useValidation(definition: Definition, specs: Map<string, NodeTypeSpec>, ready: boolean) {
  const [serverErrors, setServerErrors] = useState<ValidationError[]>([]);
  const [validationNote, setValidationNote] = useState<string | null>(null);
  const [forms, setForms] = useState<FormsModule | null>(null);
  useEffect(() => {
    loadForms().then(setForms);
  }, []);
  const localErrors = useMemo(() => {
    const errors: ValidationError[] = [];
    if (!forms) return errors;
    const { configErrors } = forms;
    for (const node of definition.nodes) {
      const spec = specs.get(node.type);
      if (!spec) continue;
      for (const e of configErrors(spec.config_schema, (node.config ?? {}) as Config)) {
        errors.push({ node: node.id, edge: null, field: e.field ? `config.${e.field}` : "config", message: e.message, local: true });
      }
    }
    return errors;
  }, [definition, specs, forms]);

  useEffect(() => {
    if (!ready) return;
    const controller = new AbortController();
    const timer = setTimeout(async () => {
      try {
        const result = await validateDefinition(definition, controller.signal);
        setServerErrors(result.errors);
        setValidationNote(null);
      } catch (error) {
        if (controller.signal.aborted) return;
        setServerErrors([]);
        setValidationNote(`The server could not check this definition (${(error as Error).message}); config forms are still checked here.`);
      }
    }, VALIDATE_DEBOUNCE_MS);
    return () => {
      clearTimeout(timer);
      controller.abort();
    };
  }, [definition, ready]);

  const errors = useMemo(() => {
    // The server's errors, plus the schema's own for fields it has not (yet) named.
    const seen = new Set(serverErrors.map((e) => `${e.node}|${e.field}`));
    return [...serverErrors, ...localErrors.filter((e) => !seen.has(`${e.node}|${e.field}`))];
  }, [serverErrors, localErrors]);
  return { errors, validationNote };
}
