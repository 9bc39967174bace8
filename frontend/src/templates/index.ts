// Templates are data (JSON files): the only place node types are named, and only as data the
// server validates like any definition.
import type { Definition } from "../types";
import demo from "./demo.json";
import telegramReminders from "./telegram_reminders.json";

export interface Template {
  id: string;
  name: string;
  description: string;
  definition: Definition;
}

export const templates: Template[] = [
  { id: "demo", ...(demo as Omit<Template, "id">) },
  { id: "telegram-reminders", ...(telegramReminders as Omit<Template, "id">) },
];
