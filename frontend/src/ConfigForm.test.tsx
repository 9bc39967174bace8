import { act, cleanup, fireEvent, render } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";
import { ConfigForm, configErrors, defaultConfig, serverErrorSchema } from "./ConfigForm";

// A schema as the registry serves it; nothing here is a real node type's.
const schema = {
  type: "object",
  properties: {
    limit: { type: "integer", minimum: 1, maximum: 100, default: 10, description: "How many results at most." },
    mode: { enum: ["fast", "thorough"], default: "fast" },
    enabled: { type: "boolean", default: true },
    note: { type: "string" },
  },
  additionalProperties: false,
};

afterEach(cleanup);

describe("form generation from a JSON Schema", () => {
  it("fills in the schema's defaults for a new node", () => {
    expect(defaultConfig(schema)).toEqual({ limit: 10, mode: "fast", enabled: true });
    expect(defaultConfig(schema, { limit: 3 })).toEqual({ limit: 3, mode: "fast", enabled: true });
  });

  it("renders one field per property, with its description, an enum as a select and a boolean as a checkbox", () => {
    const { container, getByText } = render(<ConfigForm schema={schema} value={defaultConfig(schema)} onChange={() => undefined} idPrefix="t" />);
    expect((container.querySelector("#t_limit") as HTMLInputElement).value).toBe("10");
    expect(getByText("How many results at most.")).toBeTruthy();
    const select = container.querySelector("#t_mode") as HTMLSelectElement;
    expect(select.tagName).toBe("SELECT");
    expect([...select.options].map((o) => o.textContent)).toContain("thorough");
    expect((container.querySelector("#t_enabled") as HTMLInputElement).type).toBe("checkbox");
    expect(container.querySelector("#t_note")).toBeTruthy();
    expect(container.querySelector("button[type=submit]")).toBeNull();
  });

  it("reports an edit and shows the schema's own error inline", async () => {
    const onChange = vi.fn();
    const { container } = render(<ConfigForm schema={schema} value={{ limit: 10 }} onChange={onChange} idPrefix="t" />);
    const input = container.querySelector("#t_limit") as HTMLInputElement;
    await act(async () => {
      fireEvent.change(input, { target: { value: "500" } });
    });
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ limit: 500 }));
    expect(container.querySelector(".error-detail")?.textContent).toMatch(/100/);
  });

  it("shows the errors the server names for a field", () => {
    const { container } = render(
      <ConfigForm schema={schema} value={{ limit: 10 }} onChange={() => undefined} idPrefix="t" serverErrors={[{ field: "config.limit", message: "too many for this server" }]} />,
    );
    expect(container.textContent).toContain("too many for this server");
  });

  it("lists a config's schema errors by field", () => {
    expect(configErrors(schema, { limit: 0 })).toEqual([{ field: "limit", message: expect.stringMatching(/>= 1/) }]);
    expect(configErrors(schema, { limit: 5 })).toEqual([]);
    expect(configErrors(schema, { other: 1 })[0].message).toMatch(/additional/i);
  });

  it("nests server field paths as the form's error schema", () => {
    expect(serverErrorSchema([{ field: "config.tools.recall.limit", message: "m" }, { field: null, message: "whole" }])).toEqual({
      tools: { recall: { limit: { __errors: ["m"] } } },
      __errors: ["whole"],
    });
  });
});
