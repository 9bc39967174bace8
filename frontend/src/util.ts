// Small helpers of the page.
import type { ValidationError } from "./types";

export function slugify(name: string): string {
  return name.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 50) || "workflow";
}

/** An error as one line: where (node, edge, field), then what. */
export function errorText(e: ValidationError): string {
  const where = [e.node, e.edge !== null && e.edge !== undefined ? `edge ${e.edge}` : null, e.field].filter(Boolean).join(" ");
  return where ? `${where}: ${e.message}` : e.message;
}

export function download(name: string, text: string) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
