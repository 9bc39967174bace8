// A node's config form, generated from its type's JSON Schema by react-jsonschema-form: defaults,
// descriptions and the schema's own validation inline, plus the errors the server names for a field.
import Form from "@rjsf/core";
import type { ErrorSchema, RJSFSchema } from "@rjsf/utils";
import { getDefaultFormState } from "@rjsf/utils";
import validator from "@rjsf/validator-ajv8";

export type Config = Record<string, unknown>;

/** A config with the schema's defaults filled in, as a new node gets it. */
export function defaultConfig(schema: Record<string, unknown>, current: Config = {}): Config {
  return (getDefaultFormState(validator, schema as RJSFSchema, current) ?? {}) as Config;
}

/** The schema's own errors for a config, as "field: message" lines ("" is the config itself). */
// Checked configs per schema: a large workflow repeats a few (type, config) pairs many times, and each
// check compiles the schema again.
const checked = new WeakMap<object, Map<string, { field: string; message: string }[]>>();

export function configErrors(schema: Record<string, unknown>, config: Config): { field: string; message: string }[] {
  let bySchema = checked.get(schema);
  if (!bySchema) checked.set(schema, (bySchema = new Map()));
  const key = JSON.stringify(config);
  const known = bySchema.get(key);
  if (known) return known;
  const found = check(schema, config);
  if (bySchema.size > 500) bySchema.clear();
  bySchema.set(key, found);
  return found;
}

function check(schema: Record<string, unknown>, config: Config): { field: string; message: string }[] {
  const { errors } = validator.validateFormData(config, schema as RJSFSchema);
  return errors.map((e) => ({
    field: (e.property ?? "").replace(/^\./, ""),
    message: e.message ?? e.stack,
  }));
}

/** Server errors ({field: "config.limit", message}) as the form's extra errors, keyed by the path. */
export function serverErrorSchema(errors: { field: string | null; message: string }[]): ErrorSchema {
  const root: Record<string, unknown> = {};
  for (const error of errors) {
    const path = (error.field ?? "").replace(/^config\.?/, "").split(".").filter(Boolean);
    let cursor = root;
    for (const part of path) {
      cursor[part] = (cursor[part] as Record<string, unknown>) ?? {};
      cursor = cursor[part] as Record<string, unknown>;
    }
    const list = (cursor.__errors as string[]) ?? [];
    list.push(error.message);
    cursor.__errors = list;
  }
  return root as ErrorSchema;
}

/**
 * Widgets chosen from the schema's shape alone: a list of unique choices is a set of checkboxes
 * (the default, a multi-select box, hides what is picked).
 */
export function uiSchemaFor(schema: Record<string, unknown>): Record<string, unknown> {
  const ui: Record<string, unknown> = {};
  const properties = (schema.properties ?? {}) as Record<string, Record<string, unknown>>;
  for (const [name, property] of Object.entries(properties)) {
    const items = property.items as Record<string, unknown> | undefined;
    if (property.type === "array" && property.uniqueItems && items && Array.isArray(items.enum)) ui[name] = { "ui:widget": "checkboxes" };
    else if (property.properties) {
      const nested = uiSchemaFor(property);
      if (Object.keys(nested).length) ui[name] = nested;
    }
  }
  return ui;
}

interface Props {
  schema: Record<string, unknown>;
  value: Config;
  onChange: (config: Config) => void;
  serverErrors?: { field: string | null; message: string }[];
  idPrefix?: string;
}

export function ConfigForm({ schema, value, onChange, serverErrors = [], idPrefix = "config" }: Props) {
  return (
    <Form
      schema={schema as RJSFSchema}
      formData={value}
      validator={validator}
      idPrefix={idPrefix}
      liveValidate="onChange"
      showErrorList={false}
      noHtml5Validate
      extraErrors={serverErrors.length ? serverErrorSchema(serverErrors) : undefined}
      onChange={(event) => onChange((event.formData ?? {}) as Config)}
      uiSchema={{ ...uiSchemaFor(schema), "ui:submitButtonOptions": { norender: true } }}
    />
  );
}
