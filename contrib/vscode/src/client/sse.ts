/**
 * Server-Sent Events parsing: bytes of a `text/event-stream` in, complete events out.
 *
 * Follows the WHATWG rules that matter for gridd: lines end in CRLF, LF or CR (a CRLF may be
 * split across two chunks), `:` lines are comments (keep-alives), `data` lines join with
 * "\n", an event is dispatched on a blank line, `id` persists as the last event id.
 */

export interface SseEvent {
  /** The `id` field in force when the event was dispatched ("" when none was ever sent). */
  readonly id: string;
  /** The `event` field, "message" when absent. */
  readonly type: string;
  readonly data: string;
}

export class SseParser {
  private buffer = "";
  private pendingCr = false;
  private data: string[] = [];
  private type = "";
  private sawData = false;
  /** The last event id seen, kept across events as the spec says. */
  lastEventId = "";
  /** The server's `retry:` advice in milliseconds, if it sent one. */
  retryMs: number | undefined;

  /** Feed a chunk of decoded text; returns the events it completed, in order. */
  feed(chunk: string): SseEvent[] {
    const out: SseEvent[] = [];
    let text = chunk;
    if (this.pendingCr) {
      this.pendingCr = false;
      if (text.startsWith("\n")) text = text.slice(1); // the LF of a CRLF split across chunks
    }
    this.buffer += text;
    let start = 0;
    for (let i = 0; i < this.buffer.length; i++) {
      const ch = this.buffer.charCodeAt(i);
      if (ch !== 10 && ch !== 13) continue;
      const line = this.buffer.slice(start, i);
      if (ch === 13) {
        if (i + 1 < this.buffer.length) {
          if (this.buffer.charCodeAt(i + 1) === 10) i++;
        } else {
          this.pendingCr = true;
        }
      }
      start = i + 1;
      const event = this.line(line);
      if (event) out.push(event);
    }
    this.buffer = this.buffer.slice(start);
    return out;
  }

  private line(line: string): SseEvent | undefined {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.data.push(value);
        this.sawData = true;
        break;
      case "event":
        this.type = value;
        break;
      case "id":
        if (!value.includes("\0")) this.lastEventId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retryMs = Number(value);
        break;
      default:
        break; // unknown fields are ignored
    }
    return undefined;
  }

  private dispatch(): SseEvent | undefined {
    const event = this.sawData
      ? { id: this.lastEventId, type: this.type || "message", data: this.data.join("\n") }
      : undefined;
    this.data = [];
    this.type = "";
    this.sawData = false;
    return event;
  }
}
