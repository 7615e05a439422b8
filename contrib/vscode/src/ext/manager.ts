/**
 * The set of connections: one per workspace folder that holds a git repository, kept in
 * step with the folders (multi-root), plus picking the folder an action is meant for.
 */

import * as fs from "node:fs";
import * as path from "node:path";

import * as vscode from "vscode";

import { FolderConnection } from "./connection";
import { offerOrStartDaemon } from "./daemon";

export class Connections implements vscode.Disposable {
  private readonly byFolder = new Map<string, FolderConnection>();
  private readonly subscriptions: vscode.Disposable[] = [];
  private readonly changed = new vscode.EventEmitter<void>();
  /** Anything about any connection changed (state, link, list of folders). */
  readonly onDidChange = this.changed.event;
  private readonly added = new vscode.EventEmitter<FolderConnection>();
  readonly onDidAdd = this.added.event;

  constructor(readonly log: vscode.LogOutputChannel) {
    this.subscriptions.push(vscode.workspace.onDidChangeWorkspaceFolders(() => this.sync()));
  }

  get all(): FolderConnection[] {
    return [...this.byFolder.values()];
  }

  sync(): void {
    const folders = vscode.workspace.workspaceFolders ?? [];
    const wanted = new Set<string>();
    for (const folder of folders) {
      if (folder.uri.scheme !== "file" || !isGitRepo(folder.uri.fsPath)) continue;
      const key = folder.uri.toString();
      wanted.add(key);
      if (this.byFolder.has(key)) continue;
      const conn = new FolderConnection(folder, this.log);
      this.byFolder.set(key, conn);
      conn.onDidChange(() => this.changed.fire());
      conn.onLink((state) => {
        if (state === "disconnected" && !conn.everConnected && !conn.offeredStart && !conn.socketExists()) {
          conn.offeredStart = true;
          void offerOrStartDaemon(conn, this.log);
        }
      });
      const watcher = vscode.workspace.createFileSystemWatcher(new vscode.RelativePattern(folder, ".grid/gridd.sock"));
      watcher.onDidCreate(() => conn.wake());
      this.subscriptions.push(watcher);
      this.added.fire(conn);
      conn.start();
    }
    for (const [key, conn] of this.byFolder) {
      if (!wanted.has(key)) {
        conn.dispose();
        this.byFolder.delete(key);
      }
    }
    void vscode.commands.executeCommand("setContext", "gridd.hasRepo", this.byFolder.size > 0);
    this.changed.fire();
  }

  forFolder(uri: vscode.Uri): FolderConnection | undefined {
    const folder = vscode.workspace.getWorkspaceFolder(uri);
    return folder ? this.byFolder.get(folder.uri.toString()) : undefined;
  }

  /** The connection an action applies to: the only one, or the one the user picks. */
  async pick(placeHolder = "Which folder's gridd?"): Promise<FolderConnection | undefined> {
    const all = this.all;
    if (all.length <= 1) {
      if (all.length === 0) void vscode.window.showWarningMessage("gridd: no workspace folder holds a git repository.");
      return all[0];
    }
    const active = vscode.window.activeTextEditor?.document.uri;
    const picked = await vscode.window.showQuickPick(
      all.map((c) => ({ label: c.name, description: c.connected ? "connected" : "not connected", conn: c })),
      { placeHolder },
    );
    return picked?.conn ?? (active ? this.forFolder(active) : undefined);
  }

  dispose(): void {
    for (const conn of this.byFolder.values()) conn.dispose();
    this.byFolder.clear();
    for (const s of this.subscriptions) s.dispose();
    this.changed.dispose();
    this.added.dispose();
  }
}

function isGitRepo(root: string): boolean {
  return fs.existsSync(path.join(root, ".git"));
}
