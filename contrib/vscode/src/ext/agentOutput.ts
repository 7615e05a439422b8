/**
 * Following an agent's output live in an output channel: catch up from `output?since=`,
 * then append `agent.output` events; after a reconnect, catch up again. Nothing is lost or
 * shown twice (see client/output.ts).
 */

import * as vscode from "vscode";

import { OutputFollower, type OutputPage } from "../client/output";
import type { FolderConnection } from "./connection";

interface Followed {
  readonly channel: vscode.OutputChannel;
  readonly follower: OutputFollower;
  readonly conn: FolderConnection;
  /** What was written, up to TEXT_CAP characters (diagnosis and tests). */
  text: string;
}

const TEXT_CAP = 4 * 1024 * 1024;

export class AgentOutputs implements vscode.Disposable {
  private readonly followed = new Map<string, Followed>();
  private readonly subscriptions: vscode.Disposable[] = [];
  private readonly hooked = new Set<FolderConnection>();

  /** Open (or reveal) the channel of `agentId` (a run of task `taskId`) and keep it current. */
  async follow(conn: FolderConnection, agentId: string, taskId?: string): Promise<vscode.OutputChannel> {
    const key = `${conn.root}\0${agentId}`;
    let entry = this.followed.get(key);
    if (!entry) {
      // Named by its task; the run's id tells two runs of one task apart.
      const channel = vscode.window.createOutputChannel(taskId ? `gridd: ${taskId} (run ${agentId})` : `gridd: run ${agentId}`);
      const follower = new OutputFollower(
        (since) => conn.call<OutputPage>("GET", `/agents/${encodeURIComponent(agentId)}/output?since=${since}&limit=1000`),
        (text) => {
          channel.append(text);
          if (created.text.length < TEXT_CAP) created.text += text;
        },
      );
      const created: Followed = { channel, follower, conn, text: "" };
      entry = created;
      this.followed.set(key, entry);
      this.hook(conn);
    }
    entry.channel.show(true);
    await entry.follower.catchUp().catch(() => undefined);
    return entry.channel;
  }

  /** The last seq shown and the text written so far for an agent (diagnosis and tests). */
  shown(conn: FolderConnection, agentId: string): { seq: number; text: string } | undefined {
    const entry = this.followed.get(`${conn.root}\0${agentId}`);
    return entry ? { seq: entry.follower.shown, text: entry.text } : undefined;
  }

  private hook(conn: FolderConnection): void {
    if (this.hooked.has(conn)) return;
    this.hooked.add(conn);
    this.subscriptions.push(
      conn.onEvent((event) => {
        if (event.type === "agent.sandbox_denied") {
          // Said in its output channel, as gridctl logs --follow says it on stderr.
          const denied = this.followed.get(`${conn.root}\0${String(event.data["agentId"])}`);
          denied?.channel.appendLine(`[gridd: the sandbox refused ${String(event.data["kind"])} ${String(event.data["target"])}]`);
          return;
        }
        if (event.type !== "agent.output") return;
        const agentId = String(event.data["agentId"]);
        const entry = this.followed.get(`${conn.root}\0${agentId}`);
        const seq = event.data["seq"];
        if (entry && typeof seq === "number") {
          void entry.follower.offer({ seq, chunk: String(event.data["chunk"] ?? "") }).catch(() => undefined);
        }
      }),
      conn.onLink((state) => {
        if (state !== "connected") return;
        for (const entry of this.followed.values()) {
          if (entry.conn === conn) void entry.follower.catchUp().catch(() => undefined);
        }
      }),
    );
  }

  dispose(): void {
    for (const e of this.followed.values()) e.channel.dispose();
    this.followed.clear();
    for (const s of this.subscriptions) s.dispose();
  }
}
