/**
 * One workspace folder's link to its gridd: the socket, the event follower, the RepoState
 * copy, and what the user should see about the link ("connected", "not connected").
 *
 * Everything the views show is read from here; every action calls through `call`.
 */

import * as fs from "node:fs";
import * as path from "node:path";

import * as vscode from "vscode";

import { Backoff } from "../client/backoff";
import { TransportError } from "../client/errors";
import { EventFollower, type LinkState } from "../client/follower";
import { RepoStore } from "../client/store";
import { Transport, type CallOptions } from "../client/transport";
import type { Conflict, GriddEvent, RepoState } from "../client/types";
import { checkVersion, type Skew } from "../client/version";

/** Events after which a fresh `GET /state` is worth it (cost, activity, attempts change). */
const REFRESH_AFTER = /^(agent\.(spawned|completed|failed|stopped|continued|reattached|rate_limited|launch_failed)|task\.|session\.|conflict\.)/;

export class FolderConnection implements vscode.Disposable {
  readonly transport: Transport;
  readonly store = new RepoStore();
  readonly follower: EventFollower;
  /** Ids of events delivered by the stream (snapshots and resets excluded), for diagnosis and tests. */
  readonly receivedIds: number[] = [];
  /** The id of the first snapshot this window received; events after it arrive one by one. */
  firstSnapshotId: number | undefined;
  private fetchedConflicts: Conflict[] = [];
  skew: Skew | undefined;
  /** Set once the user has been told the daemon is not running (asked once per folder). */
  offeredStart = false;
  everConnected = false;
  private readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChange = this.changed.event;
  private readonly events = new vscode.EventEmitter<GriddEvent>();
  readonly onEvent = this.events.event;
  private readonly links = new vscode.EventEmitter<LinkState>();
  readonly onLink = this.links.event;
  private refreshTimer: NodeJS.Timeout | undefined;
  private disposed = false;
  /** The daemon said goodbye (`daemon.stopping`: a clean `gridctl daemon stop`); cleared when it answers again. */
  stoppedOnPurpose = false;
  /** While stopped on purpose: no reconnect attempts, only a look at the socket file until a new daemon makes one. */
  private stoppedWatch: NodeJS.Timeout | undefined;

  constructor(
    readonly folder: vscode.WorkspaceFolder,
    private readonly log: vscode.LogOutputChannel,
  ) {
    this.transport = new Transport(FolderConnection.socketPath(folder));
    this.follower = new EventFollower(
      this.transport,
      {
        onEvent: (e) => this.onStreamEvent(e),
        onReset: (info) => this.onReset(info),
        onState: (state, error) => this.onLinkState(state, error),
      },
      new Backoff({ initialMs: 250, maxMs: 4_000, factor: 2, jitter: 0.2 }),
    );
  }

  static socketPath(folder: vscode.WorkspaceFolder): string {
    return path.join(folder.uri.fsPath, ".grid", "gridd.sock");
  }

  get name(): string {
    return this.folder.name;
  }

  get root(): string {
    return this.folder.uri.fsPath;
  }

  get link(): LinkState {
    return this.follower.link;
  }

  get connected(): boolean {
    return this.follower.link === "connected" && this.store.loaded;
  }

  get state(): RepoState {
    return this.store.state;
  }

  /** Is a socket file there at all (a daemon was started here at some point)? */
  socketExists(): boolean {
    return fs.existsSync(this.transport.socketPath);
  }

  start(): void {
    this.follower.start();
  }

  reconnectNow(): void {
    this.follower.reconnectNow();
  }

  /** After a clean stop: stop retrying; reconnect once a daemon makes its socket anew. */
  private settleStopped(): void {
    if (this.stoppedWatch || this.disposed) return;
    const stamp = (): string => {
      try {
        const st = fs.statSync(this.transport.socketPath);
        return `${st.ino}:${st.mtimeMs}`;
      } catch {
        return "";
      }
    };
    const before = stamp();
    this.follower.stop();
    this.log.info(`${this.name}: gridd was stopped; not reconnecting until it is started again`);
    this.stoppedWatch = setInterval(() => {
      const now = stamp();
      if (now && now !== before) this.wake();
    }, 1_000);
  }

  /** Connect again (the daemon is back, or the user asked). */
  wake(): void {
    if (this.stoppedWatch) clearInterval(this.stoppedWatch);
    this.stoppedWatch = undefined;
    this.follower.reconnectNow();
  }

  call<T = unknown>(method: string, urlPath: string, options?: CallOptions): Promise<T> {
    return this.transport.call<T>(method, urlPath, options);
  }

  /** Fetch `/state` (and `/conflicts`) and take it if it is not older than what we hold. */
  async refresh(): Promise<void> {
    try {
      const state = await this.call<RepoState>("GET", "/state");
      if (this.store.accept(state)) this.changed.fire();
    } catch (error) {
      this.log.debug(`${this.name}: GET /state failed: ${String(error)}`);
    }
    await this.refreshConflicts();
  }

  private async refreshConflicts(): Promise<void> {
    try {
      const body = await this.call<unknown>("GET", "/conflicts");
      const list = Array.isArray(body) ? body : (body as { conflicts?: unknown })?.conflicts;
      this.fetchedConflicts = Array.isArray(list) ? (list as Conflict[]) : [];
      this.changed.fire();
    } catch {
      this.fetchedConflicts = []; // an older gridd without the conflict radar
    }
  }

  /** The conflict radar's findings: from the latest snapshot when it carries them, else /conflicts. */
  get conflicts(): Conflict[] {
    return Array.isArray(this.store.state.conflicts) ? this.store.state.conflicts : this.fetchedConflicts;
  }

  private scheduleRefresh(): void {
    if (this.refreshTimer) return;
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = undefined;
      if (!this.disposed && this.follower.link === "connected") void this.refresh();
    }, 300);
  }

  private onStreamEvent(event: GriddEvent): void {
    if (event.type === "state.snapshot") {
      if (this.firstSnapshotId === undefined) this.firstSnapshotId = event.id;
    } else if (event.type !== "reset") {
      this.receivedIds.push(event.id);
      if (this.receivedIds.length > 100_000) this.receivedIds.splice(0, 50_000);
    }
    if (event.type === "daemon.stopping") this.stoppedOnPurpose = true;
    const visible = this.store.apply(event);
    this.events.fire(event);
    if (REFRESH_AFTER.test(event.type)) this.scheduleRefresh();
    if (visible) this.changed.fire();
  }

  private onReset(info: Record<string, unknown>): void {
    // The daemon cannot replay from our id (pruned log, or a new database): what we hold may
    // be stale. gridd sends a snapshot next; /state is fetched as well so views never wait.
    this.log.warn(`${this.name}: gridd could not replay from event ${String(info["requested"])}; resynchronising`);
    this.store.clear();
    this.receivedIds.length = 0;
    this.firstSnapshotId = undefined;
    void this.refresh();
  }

  private onLinkState(state: LinkState, error?: Error): void {
    if (state === "connected") {
      this.everConnected = true;
      this.stoppedOnPurpose = false;
      this.offeredStart = false;
      this.log.info(`${this.name}: connected to gridd (resuming after event ${String(this.follower.lastId ?? "none")})`);
      void this.checkVersion();
      void this.refreshConflicts();
    } else if (state === "disconnected") {
      // One line per attempt at debug level only: a restart is not an error storm.
      const why = error instanceof TransportError ? error.errno ?? error.message : error?.message ?? "stream ended";
      if (this.stoppedOnPurpose) this.settleStopped();
      else this.log.debug(`${this.name}: not connected (${why}); retrying`);
    }
    this.links.fire(state);
    this.changed.fire();
  }

  private async checkVersion(): Promise<void> {
    try {
      this.skew = checkVersion(await this.call("GET", "/version"));
    } catch (error) {
      this.skew = { ok: false, message: `could not read gridd's /version: ${String(error)}` };
    }
    if (!this.skew.ok) this.log.warn(`${this.name}: ${this.skew.message}`);
    this.changed.fire();
  }

  dispose(): void {
    this.disposed = true;
    if (this.refreshTimer) clearTimeout(this.refreshTimer);
    if (this.stoppedWatch) clearInterval(this.stoppedWatch);
    this.follower.stop();
    this.changed.dispose();
    this.events.dispose();
    this.links.dispose();
  }
}
