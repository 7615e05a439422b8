import { strict as assert } from "node:assert";
import { test } from "node:test";

import { SseParser } from "../../src/client/sse";

test("parses gridd's CRLF events with id, type and JSON data", () => {
  const p = new SseParser();
  const events = p.feed('id: 42\r\nevent: agent.output\r\ndata: {"seq":2}\r\n\r\n');
  assert.deepEqual(events, [{ id: "42", type: "agent.output", data: '{"seq":2}' }]);
  assert.equal(p.lastEventId, "42");
});

test("an event split anywhere across chunks, even inside a CRLF, comes out once and whole", () => {
  const wire = 'id: 7\r\nevent: tasks.changed\r\ndata: {"a":1}\r\n\r\nid: 8\r\nevent: x\r\ndata: {}\r\n\r\n';
  for (let cut = 1; cut < wire.length; cut++) {
    const p = new SseParser();
    const events = [...p.feed(wire.slice(0, cut)), ...p.feed(wire.slice(cut))];
    assert.deepEqual(
      events.map((e) => [e.id, e.type, e.data]),
      [["7", "tasks.changed", '{"a":1}'], ["8", "x", "{}"]],
      `cut at ${cut}`,
    );
  }
});

test("comments (keep-alive pings) and blank lines without data dispatch nothing", () => {
  const p = new SseParser();
  assert.deepEqual(p.feed(": ping - 2026-11-22 09:00:15\r\n\r\n\r\n"), []);
});

test("multi-line data joins with newlines; LF and CR line ends work too", () => {
  const p = new SseParser();
  assert.deepEqual(p.feed("data: a\ndata: b\n\n"), [{ id: "", type: "message", data: "a\nb" }]);
  assert.deepEqual(p.feed("event: e\rdata: c\r\r"), [{ id: "", type: "e", data: "c" }]);
});

test("the id persists to later events that carry none; retry is recorded", () => {
  const p = new SseParser();
  p.feed("id: 5\nretry: 3000\ndata: x\n\n");
  const [e] = p.feed("data: y\n\n");
  assert.equal(e?.id, "5");
  assert.equal(p.retryMs, 3000);
});

test("a field without a colon and a value without a space are read as the spec says", () => {
  const p = new SseParser();
  assert.deepEqual(p.feed("data\nevent:t\n\n"), [{ id: "", type: "t", data: "" }]);
});
