/**
 * Following gridd's event stream for as long as it takes: reconnect with backoff and
 * `Last-Event-ID`, skip duplicates, and report a `reset` so the caller can resynchronise.
 *
 * A daemon restart is one "disconnected" transition and quiet retries, never an error per
 * attempt. Timers and the stream opener are injected, so the logic is tested without sockets.
 */

import { Backoff } from "./backoff";
import { GriddError } from "./errors";
import { SseParser } from "./sse";
import type { GriddEvent } from "./types";

export type LinkState = "connecting" | "connected" | "disconnected" | "stopped";

export interface StreamOpener {
  stream(
    path: string,
    headers: Record<string, string>,
    onText: (text: string) => void,
    onClose: (error?: Error) => void,
    onOpen?: () => void,
  ): { close(): void };
}

export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const realTimers: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

export interface FollowerHooks {
  /** Every event after de-duplication, snapshots and resets included, in order. */
  onEvent(event: GriddEvent): void;
  /** gridd could not replay from our id: whatever we hold may be stale. */
  onReset(info: Record<string, unknown>): void;
  onState(state: LinkState, error?: Error): void;
}

export class EventFollower {
  private parser = new SseParser();
  private handle: { close(): void } | undefined;
  private timer: unknown;
  private state: LinkState = "disconnected";
  /** The id of the last event delivered; resumes from here after a disconnect. */
  lastId: number | undefined;
  /** Reconnect attempts since the stream was last healthy. */
  get failures(): number {
    return this.backoff.attempts;
  }

  constructor(
    private readonly opener: StreamOpener,
    private readonly hooks: FollowerHooks,
    private readonly backoff: Backoff = new Backoff(),
    private readonly timers: Timers = realTimers,
  ) {}

  get link(): LinkState {
    return this.state;
  }

  start(): void {
    if (this.state === "connecting" || this.state === "connected") return;
    this.connect();
  }

  stop(): void {
    this.setState("stopped");
    if (this.timer !== undefined) this.timers.clearTimeout(this.timer);
    this.timer = undefined;
    this.handle?.close();
    this.handle = undefined;
  }

  /** Drop a pending backoff wait and connect now (e.g. the user asked, or the daemon was started). */
  reconnectNow(): void {
    if (this.state === "connected" || this.state === "connecting") return;
    if (this.timer !== undefined) this.timers.clearTimeout(this.timer);
    this.timer = undefined;
    this.connect();
  }

  private connect(): void {
    this.setState("connecting");
    this.parser = new SseParser();
    const headers: Record<string, string> = {};
    if (this.lastId !== undefined) headers["last-event-id"] = String(this.lastId);
    let opened = false;
    const mine = this.opener.stream(
      "/events",
      headers,
      (text) => {
        if (this.handle === mine) this.onText(text);
      },
      (error) => {
        if (this.handle === mine) this.onClose(error, opened);
      },
      () => {
        if (this.handle !== mine) return;
        opened = true;
        this.backoff.reset();
        this.setState("connected");
      },
    );
    this.handle = mine;
  }

  private onText(text: string): void {
    for (const raw of this.parser.feed(text)) {
      const id = Number(raw.id);
      let data: Record<string, unknown> = {};
      try {
        const parsed: unknown = JSON.parse(raw.data);
        if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) {
          data = parsed as Record<string, unknown>;
        }
      } catch {
        continue; // not JSON: not a gridd event
      }
      const perStream = raw.type === "state.snapshot" || raw.type === "reset";
      if (!perStream && Number.isFinite(id) && this.lastId !== undefined && id <= this.lastId) {
        continue; // already delivered before a reconnect
      }
      if (raw.id !== "" && Number.isFinite(id)) this.lastId = id;
      const event: GriddEvent = { id, type: raw.type, data };
      if (raw.type === "reset") this.hooks.onReset(data);
      this.hooks.onEvent(event);
    }
  }

  private onClose(error: Error | undefined, opened: boolean): void {
    this.handle = undefined;
    if (this.state === "stopped") return;
    if (error instanceof GriddError && error.code === "bad_last_event_id") {
      this.lastId = undefined; // start over from a snapshot
    }
    this.setState("disconnected", opened ? undefined : error);
    this.timer = this.timers.setTimeout(() => {
      this.timer = undefined;
      if (this.state !== "stopped") this.connect();
    }, this.backoff.next());
  }

  private setState(state: LinkState, error?: Error): void {
    if (state === this.state && !error) return;
    this.state = state;
    this.hooks.onState(state, error);
  }
}
