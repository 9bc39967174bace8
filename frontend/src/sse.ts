// Server-sent events read from a fetch() body: EventSource cannot POST, so the run stream is parsed
// here, by the rules of the HTML standard's event-stream format (fields event/data/id, comments,
// any line ending, data lines joined with "\n", an event dispatched on a blank line).
import { requestHeaders } from "./api";

export interface StreamEvent {
  event: string;
  data: string;
  id?: string;
}

export class SseParser {
  private buffer = "";
  private eventType = "";
  private dataLines: string[] = [];
  private lastId: string | undefined;
  private pendingCR = false;

  /** Feed a chunk of text; returns the events completed by it. */
  push(chunk: string): StreamEvent[] {
    const events: StreamEvent[] = [];
    let text = chunk;
    if (this.pendingCR && text.startsWith("\n")) text = text.slice(1); // "\r\n" split across chunks
    this.pendingCR = false;
    this.buffer += text;
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (!match) break;
      if (match[0] === "\r" && match.index === this.buffer.length - 1) {
        // a lone "\r" at the end may be the first half of "\r\n": end the line, skip a "\n" next
        this.pendingCR = true;
      }
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      const event = this.line(line);
      if (event) events.push(event);
    }
    return events;
  }

  /** The end of the stream: an unterminated event is dropped, as the standard says. */
  end(): StreamEvent[] {
    this.buffer = "";
    this.dataLines = [];
    this.eventType = "";
    return [];
  }

  private line(line: string): StreamEvent | null {
    if (line === "") {
      if (!this.dataLines.length) {
        this.eventType = "";
        return null;
      }
      const event: StreamEvent = { event: this.eventType || "message", data: this.dataLines.join("\n") };
      if (this.lastId !== undefined) event.id = this.lastId;
      this.eventType = "";
      this.dataLines = [];
      return event;
    }
    if (line.startsWith(":")) return null; // a comment (keep-alive)
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.eventType = value;
    else if (field === "data") this.dataLines.push(value);
    else if (field === "id" && !value.includes("\0")) this.lastId = value;
    return null;
  }
}

export interface ParsedEvent {
  event: string;
  data: Record<string, unknown>;
}

/** Parse an event's data as the JSON object the run stream sends. */
export function decodeEvent(event: StreamEvent): ParsedEvent {
  try {
    const data = JSON.parse(event.data);
    return { event: event.event, data: data && typeof data === "object" ? data : { value: data } };
  } catch {
    return { event: event.event, data: { text: event.data } };
  }
}

/** Read a stream of bytes as server-sent events, calling `onEvent` for each as it arrives. */
export async function readEventStream(
  body: ReadableStream<Uint8Array>,
  onEvent: (event: ParsedEvent) => void,
): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    for (const event of parser.push(decoder.decode(value, { stream: true }))) onEvent(decodeEvent(event));
  }
  for (const event of parser.push(decoder.decode())) onEvent(decodeEvent(event));
  parser.end();
}

export interface RunRequest {
  message: string;
  channel: string;
  external_id: string;
  display_name?: string;
  conversation_id?: string;
}

/** POST a run and stream its events; rejects with the server's reason when the run cannot start. */
export async function streamRun(
  slug: string,
  body: RunRequest,
  onEvent: (event: ParsedEvent) => void,
  signal?: AbortSignal,
): Promise<void> {
  const response = await fetch(`/api/v1/workflows/${encodeURIComponent(slug)}/runs/stream/`, {
    method: "POST",
    credentials: "same-origin",
    headers: { ...requestHeaders("POST"), Accept: "text/event-stream" },
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok || !response.body) {
    const text = await response.text().catch(() => "");
    let reason = text;
    try {
      const data = JSON.parse(text);
      reason = typeof data.detail === "string" ? data.detail : JSON.stringify(data);
    } catch {
      /* not JSON: keep the text */
    }
    throw new Error(`the run could not start (${response.status}): ${reason || response.statusText}`);
  }
  await readEventStream(response.body, onEvent);
}
