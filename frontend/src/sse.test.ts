import { describe, expect, it } from "vitest";
import { SseParser, decodeEvent, readEventStream, type ParsedEvent } from "./sse";

function streamOf(chunks: string[]): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(encoder.encode(chunk));
      controller.close();
    },
  });
}

describe("SseParser", () => {
  it("parses typed events with JSON data", () => {
    const parser = new SseParser();
    const events = parser.push('event: node_started\ndata: {"node": "recall"}\n\nevent: run_finished\ndata: {"status": "succeeded"}\n\n');
    expect(events.map(decodeEvent)).toEqual([
      { event: "node_started", data: { node: "recall" } },
      { event: "run_finished", data: { status: "succeeded" } },
    ]);
  });

  it("completes an event split anywhere across chunks, even inside a CRLF", () => {
    const text = 'event: node_finished\r\ndata: {"node": "agent", "output": {"reply": "hi"}}\r\n\r\n';
    for (let cut = 1; cut < text.length; cut++) {
      const parser = new SseParser();
      const events = [...parser.push(text.slice(0, cut)), ...parser.push(text.slice(cut))];
      expect(events, `cut at ${cut}`).toHaveLength(1);
      expect(decodeEvent(events[0])).toEqual({ event: "node_finished", data: { node: "agent", output: { reply: "hi" } } });
    }
  });

  it("joins data lines, ignores comments and unknown fields, and defaults the type to message", () => {
    const parser = new SseParser();
    const events = parser.push(": keep-alive\nretry: 100\ndata: one\ndata: two\nid: 7\n\n");
    expect(events).toEqual([{ event: "message", data: "one\ntwo", id: "7" }]);
  });

  it("dispatches nothing for an event without data, nor for an unterminated one", () => {
    const parser = new SseParser();
    expect(parser.push("event: ping\n\n")).toEqual([]);
    expect(parser.push("event: run_started\ndata: {}")).toEqual([]);
    expect(parser.end()).toEqual([]);
  });

  it("accepts bare CR line endings and a field without a space after the colon", () => {
    const parser = new SseParser();
    expect(parser.push("event:node_error\rdata:{\"node\":\"x\",\"error\":\"boom\"}\r\r").map(decodeEvent)).toEqual([
      { event: "node_error", data: { node: "x", error: "boom" } },
    ]);
  });

  it("keeps data that is not JSON as text", () => {
    expect(decodeEvent({ event: "message", data: "not json" })).toEqual({ event: "message", data: { text: "not json" } });
  });
});

describe("readEventStream", () => {
  it("hands over each event as its bytes arrive, multi-byte characters split across chunks included", async () => {
    const bytes = new TextEncoder().encode('event: node_finished\ndata: {"node": "agent", "output": "Grüße"}\n\n');
    const cut = bytes.indexOf(0xc3) + 1; // inside the two bytes of "ü"
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(bytes.slice(0, cut));
        controller.enqueue(bytes.slice(cut));
        controller.close();
      },
    });
    const seen: ParsedEvent[] = [];
    await readEventStream(stream, (e) => seen.push(e));
    expect(seen).toEqual([{ event: "node_finished", data: { node: "agent", output: "Grüße" } }]);
  });

  it("reads a whole run in order", async () => {
    const seen: string[] = [];
    await readEventStream(
      streamOf([
        'event: run_started\ndata: {"run_id": 1}\n\n',
        'event: node_started\ndata: {"node": "a"}\n\nevent: node_finished\ndata: {"node": "a"}\n',
        '\nevent: run_finished\ndata: {"status": "succeeded"}\n\n',
      ]),
      (e) => seen.push(e.event),
    );
    expect(seen).toEqual(["run_started", "node_started", "node_finished", "run_finished"]);
  });
});
