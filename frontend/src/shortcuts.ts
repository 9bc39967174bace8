// Keyboard shortcuts and the clipboard: nodes are copied and pasted as JSON text.
import { useEffect } from "react";
import { copySelection, pasteInto } from "./graph";
import type { Definition } from "./types";

export function isEditable(target: EventTarget | null): boolean {
  const el = target as HTMLElement | null;
  return Boolean(el && (el.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(el.tagName)));
}

interface Actions {
  save: () => unknown;
  startRun: () => unknown;
  undo: () => void;
  redo: () => void;
  blocked: string | null;
  selectedNodeIds: Set<string>;
  commit: (definition: Definition) => void;
  deleteElements: (nodeIds: Set<string>, edgeIds: Set<string>) => void;
  say: (text: string, options?: { undo?: boolean; error?: boolean }) => void;
  present: () => Definition;
  select: (ids: Set<string>) => void;
}

export function useShortcuts({ save, startRun, undo, redo, blocked, selectedNodeIds, commit, deleteElements, say, present, select }: Actions) {
  useEffect(() => {
    const onKey = (event: KeyboardEvent) => {
      const mod = event.ctrlKey || event.metaKey;
      if (!mod) return;
      const key = event.key.toLowerCase();
      if (key === "s") {
        event.preventDefault();
        save();
      } else if (key === "enter") {
        event.preventDefault();
        if (!blocked) startRun();
      } else if (isEditable(event.target)) {
        return; // undo inside a text field is the field's own
      } else if (key === "z" && !event.shiftKey) {
        event.preventDefault();
        undo();
      } else if ((key === "z" && event.shiftKey) || key === "y") {
        event.preventDefault();
        redo();
      }
    };
    const onCopy = (event: ClipboardEvent) => {
      if (isEditable(event.target) || !selectedNodeIds.size) return;
      event.clipboardData?.setData("text/plain", copySelection(present(), selectedNodeIds));
      event.preventDefault();
      say(`Copied ${selectedNodeIds.size} node${selectedNodeIds.size > 1 ? "s" : ""} as JSON.`);
      if (event.type === "cut") deleteElements(new Set(selectedNodeIds), new Set());
    };
    const onPaste = (event: ClipboardEvent) => {
      if (isEditable(event.target)) return;
      const text = event.clipboardData?.getData("text/plain") ?? "";
      const pasted = pasteInto(present(), text);
      if (!pasted) {
        if (text.trim()) say("The clipboard holds no nodes copied as JSON.", { error: true });
        return;
      }
      event.preventDefault();
      commit(pasted.definition);
      const ids = new Set(pasted.ids);
      select(ids);
    };
    window.addEventListener("keydown", onKey);
    document.addEventListener("copy", onCopy);
    document.addEventListener("cut", onCopy);
    document.addEventListener("paste", onPaste);
    return () => {
      window.removeEventListener("keydown", onKey);
      document.removeEventListener("copy", onCopy);
      document.removeEventListener("cut", onCopy);
      document.removeEventListener("paste", onPaste);
    };
  }, [save, startRun, undo, redo, blocked, selectedNodeIds, commit, deleteElements, say, present, select]);

}
