import { strict as assert } from "node:assert";
import * as fs from "node:fs";
import * as http from "node:http";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";

import { Backoff } from "../../src/client/backoff";
import { GriddError } from "../../src/client/errors";
import { EventFollower, type LinkState, type StreamOpener, type Timers } from "../../src/client/follower";
import { Transport } from "../../src/client/transport";
import type { GriddEvent } from "../../src/client/types";

interface FakeStream {
  headers: Record<string, string>;
  text(t: string): void;
  close(error?: Error): void;
  open(): void;
}

function fakeOpener(): { opener: StreamOpener; streams: FakeStream[] } {
  const streams: FakeStream[] = [];
  return {
    streams,
    opener: {
      stream(_p, headers, onText, onClose, onOpen) {
        streams.push({ headers, text: onText, close: onClose, open: () => onOpen?.() });
        return { close() {} };
      },
    },
  };
}

function fakeTimers(): Timers & { pending: Array<{ fn: () => void; ms: number }>; fire(): void } {
  const pending: Array<{ fn: () => void; ms: number }> = [];
  return {
    pending,
    setTimeout(fn, ms) {
      const t = { fn, ms };
      pending.push(t);
      return t;
    },
    clearTimeout(h) {
      const i = pending.indexOf(h as { fn: () => void; ms: number });
      if (i >= 0) pending.splice(i, 1);
    },
    fire() {
      pending.shift()?.fn();
    },
  };
}

const ev = (id: number, type: string, data: object = {}): string =>
  `id: ${id}\r\nevent: ${type}\r\ndata: ${JSON.stringify(data)}\r\n\r\n`;

function follower() {
  const { opener, streams } = fakeOpener();
  const timers = fakeTimers();
  const events: GriddEvent[] = [];
  const states: LinkState[] = [];
  const resets: Record<string, unknown>[] = [];
  const f = new EventFollower(
    opener,
    { onEvent: (e) => events.push(e), onReset: (r) => resets.push(r), onState: (s) => states.push(s) },
    new Backoff({ initialMs: 100, maxMs: 800, factor: 2, jitter: 0 }),
    timers,
  );
  return { f, streams, timers, events, states, resets };
}

test("resumes with Last-Event-ID after the stream ends and skips events it already has", () => {
  const { f, streams, timers, events } = follower();
  f.start();
  assert.deepEqual(streams[0]?.headers, {});
  streams[0]?.open();
  streams[0]?.text(ev(3, "state.snapshot", { tasks: [] }) + ev(4, "tasks.changed"));
  streams[0]?.close();
  assert.equal(timers.pending[0]?.ms, 100);
  timers.fire();
  assert.deepEqual(streams[1]?.headers, { "last-event-id": "4" });
  streams[1]?.open();
  streams[1]?.text(ev(4, "tasks.changed") + ev(5, "agent.spawned"));
  assert.deepEqual(events.map((e) => [e.id, e.type]), [[3, "state.snapshot"], [4, "tasks.changed"], [5, "agent.spawned"]]);
});

test("a daemon that stays down is retried with growing delays and one disconnected state per attempt, no events", () => {
  const { f, streams, timers, states } = follower();
  f.start();
  for (let i = 0; i < 5; i++) {
    streams[i]?.close(new Error("connect ECONNREFUSED"));
    timers.fire();
  }
  assert.equal(streams.length, 6);
  assert.deepEqual(states.slice(0, 4), ["connecting", "disconnected", "connecting", "disconnected"]);
  assert.equal(f.failures, 5);
  streams[5]?.open();
  assert.equal(f.link, "connected");
  assert.equal(f.failures, 0, "a healthy stream resets the backoff");
});

test("the delays follow the backoff and stop at its cap", () => {
  const { f, streams, timers } = follower();
  f.start();
  const delays: number[] = [];
  for (let i = 0; i < 6; i++) {
    streams[i]?.close(new Error("down"));
    delays.push(timers.pending[0]?.ms ?? -1);
    timers.fire();
  }
  assert.deepEqual(delays, [100, 200, 400, 800, 800, 800]);
});

test("a reset is reported before its snapshot so the caller can resync", () => {
  const { f, streams, resets, events } = follower();
  f.lastId = 999;
  f.start();
  streams[0]?.open();
  streams[0]?.text(ev(12, "reset", { requested: 999, oldestRetained: 1, latest: 12 }) + ev(12, "state.snapshot", {}));
  assert.deepEqual(resets, [{ requested: 999, oldestRetained: 1, latest: 12 }]);
  assert.deepEqual(events.map((e) => e.type), ["reset", "state.snapshot"]);
  assert.equal(f.lastId, 12);
});

test("a refused Last-Event-ID is dropped so the next stream starts from a snapshot", () => {
  const { f, streams, timers } = follower();
  f.lastId = 7;
  f.start();
  streams[0]?.close(new GriddError(400, "bad_last_event_id", "bad"));
  timers.fire();
  assert.deepEqual(streams[1]?.headers, {});
});

test("stop ends the stream and cancels any pending reconnect", () => {
  const { f, streams, timers } = follower();
  f.start();
  streams[0]?.close(new Error("down"));
  assert.equal(timers.pending.length, 1);
  f.stop();
  assert.equal(timers.pending.length, 0);
  assert.equal(f.link, "stopped");
});

test("over a real Unix socket: events, a server restart, and Last-Event-ID on reconnect", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gsse"));
  const sock = path.join(dir, "s.sock");
  const seen: Array<string | undefined> = [];
  const serve = (): http.Server => {
    const server = http.createServer((req, res) => {
      seen.push(req.headers["last-event-id"] as string | undefined);
      res.writeHead(200, { "content-type": "text/event-stream" });
      const from = Number(req.headers["last-event-id"] ?? 0);
      res.write(ev(from + 1, "tasks.changed", { n: from + 1 }));
      res.write(ev(from + 2, "tasks.changed", { n: from + 2 }));
      setTimeout(() => res.end(), 20);
    });
    server.listen(sock);
    return server;
  };
  let server = serve();
  const got: number[] = [];
  let done: () => void = () => undefined;
  const finished = new Promise<void>((r) => (done = r));
  const f = new EventFollower(
    new Transport(sock),
    {
      onEvent: (e) => {
        got.push(e.id);
        if (got.length === 2) {
          server.close();
          server.closeAllConnections();
          setTimeout(() => (server = serve()), 100);
        }
        if (got.length === 4) done();
      },
      onReset: () => undefined,
      onState: () => undefined,
    },
    new Backoff({ initialMs: 20, maxMs: 50, factor: 2, jitter: 0 }),
  );
  f.start();
  await finished;
  f.stop();
  server.close();
  assert.deepEqual(got, [1, 2, 3, 4]);
  assert.equal(seen[0], undefined);
  assert.equal(seen.at(-1), "2");
  fs.rmSync(dir, { recursive: true, force: true });
});
