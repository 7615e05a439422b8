/**
 * HTTP over gridd's Unix socket with Node's `http` (`socketPath`): JSON calls and the raw
 * event stream. Error answers become `GriddError`, socket failures `TransportError`.
 */

import * as http from "node:http";

import { GriddError, TransportError, parseErrorBody } from "./errors";

export interface CallOptions {
  readonly body?: unknown;
  /** Sent as-is with this content type instead of JSON-encoding `body`. */
  readonly raw?: { readonly text: string; readonly contentType: string };
  readonly timeoutMs?: number;
}

export class Transport {
  constructor(
    readonly socketPath: string,
    private readonly defaultTimeoutMs = 15_000,
  ) {}

  /** One request; resolves with the parsed JSON answer of a 2xx, rejects otherwise. */
  call<T = unknown>(method: string, path: string, options: CallOptions = {}): Promise<T> {
    const payload = options.raw
      ? options.raw.text
      : options.body === undefined ? undefined : JSON.stringify(options.body);
    const headers: Record<string, string> = { accept: "application/json" };
    if (payload !== undefined) {
      headers["content-type"] = options.raw ? options.raw.contentType : "application/json";
      headers["content-length"] = String(Buffer.byteLength(payload));
    }
    return new Promise<T>((resolve, reject) => {
      const req = http.request(
        { socketPath: this.socketPath, method, path, headers, host: "gridd" },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("error", (e: NodeJS.ErrnoException) => reject(new TransportError(e.message, e.code)));
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString("utf8");
            const status = res.statusCode ?? 0;
            if (status < 200 || status >= 300) {
              reject(parseErrorBody(status, text));
              return;
            }
            try {
              resolve((text ? JSON.parse(text) : undefined) as T);
            } catch {
              reject(new GriddError(status, "bad_answer", `gridd sent a body that is not JSON: ${text.slice(0, 100)}`));
            }
          });
        },
      );
      req.setTimeout(options.timeoutMs ?? this.defaultTimeoutMs, () => {
        req.destroy(Object.assign(new Error("gridd did not answer in time"), { code: "ETIMEDOUT" }));
      });
      req.on("error", (e: NodeJS.ErrnoException) => reject(new TransportError(e.message, e.code)));
      if (payload !== undefined) req.write(payload);
      req.end();
    });
  }

  /**
   * Open `GET path` as an event stream. `onText` gets decoded chunks; `onClose` is called
   * exactly once when the stream ends or fails (with the error, if any).
   */
  stream(
    path: string,
    headers: Record<string, string>,
    onText: (text: string) => void,
    onClose: (error?: Error) => void,
    onOpen: () => void = () => undefined,
  ): { close(): void } {
    let closed = false;
    const finish = (error?: Error): void => {
      if (closed) return;
      closed = true;
      onClose(error);
    };
    const req = http.request(
      { socketPath: this.socketPath, method: "GET", path, host: "gridd", headers: { accept: "text/event-stream", ...headers } },
      (res) => {
        const status = res.statusCode ?? 0;
        if (status !== 200) {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => finish(parseErrorBody(status, Buffer.concat(chunks).toString("utf8"))));
          res.on("error", (e: NodeJS.ErrnoException) => finish(new TransportError(e.message, e.code)));
          return;
        }
        onOpen();
        res.setEncoding("utf8");
        res.on("data", (text: string) => {
          if (!closed) onText(text);
        });
        res.on("end", () => finish());
        res.on("error", (e: NodeJS.ErrnoException) => finish(new TransportError(e.message, e.code)));
        res.on("close", () => finish());
      },
    );
    req.on("error", (e: NodeJS.ErrnoException) => finish(new TransportError(e.message, e.code)));
    req.end();
    return {
      close: () => {
        closed = true;
        req.destroy();
      },
    };
  }
}
