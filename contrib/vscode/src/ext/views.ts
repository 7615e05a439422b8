/**
 * The gridd view container's trees: session, tasks (grouped by status), agents, questions,
 * merges and conflicts. Each is a pure rendering of the connections' RepoState; with more
 * than one repository in the workspace, each tree has one top-level node per folder.
 */

import * as fs from "node:fs";
import * as path from "node:path";

import * as vscode from "vscode";

import { agentsRow, askedAboutMerge, conflictMark, linkBanner, reviewEditsNote, stopReasonText, taskName, type LinkBanner } from "../client/review";
import { trainRows } from "../client/train";
import type { Agent, Question, Task } from "../client/types";
import type { FolderConnection } from "./connection";
import type { Connections } from "./manager";
import { reviewEdits } from "./reviewing";

export type Node =
  | { kind: "folder"; conn: FolderConnection }
  | { kind: "info"; conn: FolderConnection | undefined; label: string; description?: string; icon?: string; command?: vscode.Command; tooltip?: string }
  | { kind: "group"; conn: FolderConnection; status: string; tasks: Task[] }
  | { kind: "task"; conn: FolderConnection; task: Task }
  | { kind: "agent"; conn: FolderConnection; agent: Agent }
  | { kind: "question"; conn: FolderConnection; question: Question };

/** Status groups, in the order a person scans them. */
export const STATUS_ORDER = ["working", "review", "merging", "ready", "pending", "rate_limited", "blocked", "failed", "done", "cancelled"];

const STATUS_ICON: Record<string, string> = {
  working: "sync~spin", review: "eye", merging: "git-merge", ready: "circle-outline", pending: "clock",
  rate_limited: "watch", blocked: "warning", failed: "error", done: "pass", cancelled: "circle-slash",
};

type Build = (conn: FolderConnection) => Node[];

export class GriddTree implements vscode.TreeDataProvider<Node> {
  private readonly emitter = new vscode.EventEmitter<Node | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;

  constructor(
    private readonly conns: Connections,
    private readonly build: Build,
  ) {}

  refresh(): void {
    this.emitter.fire(undefined);
  }

  getChildren(node?: Node): Node[] {
    if (!node) {
      const all = this.conns.all;
      if (all.length === 1 && all[0]) return this.build(all[0]);
      return all.map((conn) => ({ kind: "folder", conn }));
    }
    if (node.kind === "folder") return this.build(node.conn);
    if (node.kind === "group") return node.tasks.map((task) => ({ kind: "task", conn: node.conn, task }));
    if (node.kind === "task") return taskDetails(node.conn, node.task);
    return [];
  }

  getTreeItem(node: Node): vscode.TreeItem {
    return render(node);
  }
}

function render(node: Node): vscode.TreeItem {
  const item = renderLive(node);
  // While disconnected, what the views hold may be stale: greyed, and its actions off.
  if ((node.kind === "task" || node.kind === "agent" || node.kind === "question") && !node.conn.connected) {
    item.contextValue = "stale";
    item.command = undefined;
    const icon = item.iconPath instanceof vscode.ThemeIcon ? item.iconPath.id : "circle";
    item.iconPath = new vscode.ThemeIcon(icon, new vscode.ThemeColor("disabledForeground"));
    item.tooltip = "gridd is not connected: this may be out of date";
  }
  return item;
}

function renderLive(node: Node): vscode.TreeItem {
  const None = vscode.TreeItemCollapsibleState.None;
  switch (node.kind) {
    case "folder": {
      const item = new vscode.TreeItem(node.conn.name, vscode.TreeItemCollapsibleState.Expanded);
      item.description = node.conn.connected ? undefined : "not connected";
      item.iconPath = new vscode.ThemeIcon("repo");
      return item;
    }
    case "info": {
      const item = new vscode.TreeItem(node.label, None);
      item.description = node.description;
      item.tooltip = node.tooltip;
      if (node.icon) item.iconPath = new vscode.ThemeIcon(node.icon);
      if (node.command) item.command = node.command;
      item.contextValue = "info";
      return item;
    }
    case "group": {
      const expanded = node.status === "done" || node.status === "cancelled" ? vscode.TreeItemCollapsibleState.Collapsed : vscode.TreeItemCollapsibleState.Expanded;
      const item = new vscode.TreeItem(`${node.status} (${node.tasks.length})`, expanded);
      item.iconPath = new vscode.ThemeIcon(STATUS_ICON[node.status] ?? "circle");
      item.id = `${node.conn.folder.uri.toString()}#group:${node.status}`;
      return item;
    }
    case "task": {
      const t = node.task;
      // The status is the group's (or the view's): the label is the id, the title follows.
      const item = new vscode.TreeItem(t.id, vscode.TreeItemCollapsibleState.Collapsed);
      const mark = conflictMark(t, askedAboutMerge(node.conn.state, t.id));
      item.description = mark ? `${mark.description} · ${taskDescription(t)}` : taskDescription(t);
      item.accessibilityInformation = { label: `${t.id}: ${t.status}, ${item.description}` };
      const review = t.status === "review" ? `\n\n${reviewEditsNote(reviewEdits(node.conn))}` : "";
      const marked = mark ? `\n\n$(warning) ${mark.description}: approving asks first${mark.message ? `\n\ngridd told its agent: ${mark.message}` : ""}` : "";
      item.tooltip = new vscode.MarkdownString(`**${t.title}**\n\n${t.error ? `error: ${t.error}\n\n` : ""}${t.prompt ?? ""}${marked}${review}`, true);
      item.iconPath = mark
        ? new vscode.ThemeIcon("warning", new vscode.ThemeColor("list.warningForeground"))
        : new vscode.ThemeIcon(STATUS_ICON[t.status] ?? "circle");
      item.contextValue = `task.${t.status}${t.worktree ? ".hasWorktree" : ""}${mark ? ".conflicted" : ""}`;
      item.id = `${node.conn.folder.uri.toString()}#task:${t.id}`;
      return item;
    }
    case "agent": {
      const a = node.agent;
      // Named by its task (what a person knows it by); the run's id only in the tooltip.
      const item = new vscode.TreeItem(a.taskId, None);
      const title = node.conn.store.task(a.taskId)?.title;
      item.description = `${title && title !== a.taskId ? `${title} · ` : ""}${agentDescription(a)}`;
      item.accessibilityInformation = { label: `agent of ${a.taskId}: ${item.description}` };
      item.tooltip = `${taskName(node.conn.state, a.taskId)}, run ${a.id}\n${a.status}${a.activity ? ` · ${a.activity}` : ""}${a.message ? `\n${a.message}` : ""}\n${a.lastOutput ?? ""}`;
      item.iconPath = new vscode.ThemeIcon(a.status === "waiting" ? "question" : a.stalled ? "warning" : "hubot");
      item.contextValue = `agent.${a.status}`;
      item.command = { title: "Follow Output", command: "gridd.followOutput", arguments: [node] };
      return item;
    }
    case "question": {
      const q = node.question;
      const item = new vscode.TreeItem(q.question, None);
      item.description = `${q.taskId}${q.options.length ? ` · ${q.options.join(" / ")}` : ""}`;
      item.iconPath = new vscode.ThemeIcon("question");
      item.contextValue = "question";
      item.command = { title: "Answer", command: "gridd.answerQuestion", arguments: [node] };
      return item;
    }
  }
}

export function taskDescription(t: Task): string {
  const parts: string[] = [t.title];
  if (t.dependsOn.length) parts.push(`after ${t.dependsOn.join(", ")}`);
  if (t.attempts > 1) parts.push(`attempt ${t.attempts}${t.maxAttempts ? `/${t.maxAttempts}` : ""}`);
  if (t.status === "rate_limited" && t.resumeAt) parts.push(`resumes ${clock(t.resumeAt)}`);
  if (t.waitingSince) parts.push("waiting for an answer");
  if (t.costUsd) parts.push(money(t.costUsd));
  return parts.join(" · ");
}

function taskDetails(conn: FolderConnection, t: Task): Node[] {
  const out: Node[] = [];
  const info = (label: string, description?: string, icon?: string): Node => ({ kind: "info", conn, label, description, icon });
  out.push(info("title", t.title, "note"));
  if (t.dependsOn.length) {
    const deps = t.dependsOn.map((d) => `${d} (${conn.store.task(d)?.status ?? "?"})`);
    out.push(info("depends on", deps.join(", "), "references"));
  }
  out.push(info("attempts", `${t.attempts}${t.maxAttempts ? ` of ${t.maxAttempts}` : ""}`, "history"));
  if (t.status === "rate_limited") out.push(info("rate limited", t.resumeAt ? `resumes ${clock(t.resumeAt)}` : "until the provider's limit resets", "watch"));
  if (t.waitingSince) out.push(info("waiting", `for an answer since ${clock(t.waitingSince)}`, "question"));
  if (t.error) out.push(info("last error", t.error, "error"));
  if (t.branch) out.push(info("branch", t.branch, "git-branch"));
  if (t.changedFiles?.length) out.push(info("changed", t.changedFiles.join(", "), "diff"));
  if (t.mergeConflict?.length) {
    const message = conflictMark(t)?.message;
    out.push({ kind: "info", conn, label: "merge conflict", description: `${t.mergeConflict.join(", ")}${message ? ` · ${firstSentence(message)}` : ""}`, icon: "git-merge", tooltip: message });
  }
  if (t.costUsd) out.push(info("cost", money(t.costUsd), "credit-card"));
  return out;
}

function firstSentence(text: string): string {
  const m = /^[^\n]*?[.!?](?=\s|$)/.exec(text.trim());
  return m ? m[0] : text.trim().split("\n")[0] ?? "";
}

export function agentDescription(a: Agent): string {
  const parts: string[] = [a.status];
  if (a.activity) parts.push(String(a.activity));
  if (a.message) parts.push(String(a.message));
  if (a.lastOutput) parts.push(`“${String(a.lastOutput).slice(0, 80)}”`);
  parts.push(money(a.costUsd ?? 0));
  if (a.stalled) parts.push("stalled");
  if (a.sandboxDenied) parts.push(`sandbox refused ${a.sandboxDenied} (last: ${a.lastDenied ?? "?"})`);
  return parts.join(" · ");
}

function bannerOf(conn: FolderConnection): LinkBanner {
  return linkBanner({
    gitRepo: true,
    connected: conn.connected,
    everConnected: conn.everConnected,
    socketExists: conn.socketExists(),
    stoppedOnPurpose: conn.stoppedOnPurpose,
    versionOk: !conn.skew || conn.skew.ok,
  });
}

/** In the Session view, while disconnected: the one thing to do, as a row that does it. */
function notConnected(conn: FolderConnection): Node[] {
  const banner = bannerOf(conn);
  const start: vscode.Command = { title: "Start gridd", command: "gridd.startDaemon", arguments: [conn] };
  if (banner === "not-running" || banner === "stopped") {
    return [{ kind: "info", conn, label: "Start gridd", description: "gridctl daemon start", icon: "debug-start", command: start }];
  }
  return [];
}

/** The one banner for the link's state (or none when every folder is connected). */
export function bannerText(conns: Connections): string | undefined {
  const all = conns.all;
  if (all.length === 0) return noRepoText();
  const lines: string[] = [];
  for (const conn of all) {
    const who = all.length > 1 ? `gridd (${conn.name})` : "gridd";
    switch (bannerOf(conn)) {
      case "not-running":
        lines.push(`${who} is not running in this repository. Start it: click Start gridd below, or run \`gridctl daemon start\`.`);
        break;
      case "stopped":
        lines.push(`${who} was stopped. Nothing is retried until it is started again: click Start gridd below, or run \`gridctl daemon start\`.`);
        break;
      case "connecting":
        lines.push(conn.everConnected ? `${who}: not connected; reconnecting… (the daemon is not answering on .grid/gridd.sock)` : `${who}: connecting…`);
        break;
      case "version-mismatch":
        lines.push(`${who}: version mismatch: ${conn.skew?.message ?? ""}`);
        break;
      default:
        break;
    }
  }
  return lines.length ? lines.join("\n") : undefined;
}

function noRepoText(): string | undefined {
  const folders = vscode.workspace.workspaceFolders ?? [];
  if (folders.length === 0) return "Open a folder that holds a git repository: gridd runs one daemon per repository.";
  const first = folders[0];
  const above = first ? repoAbove(first.uri.fsPath) : undefined;
  if (above) return `This folder is inside the git repository ${above}. gridd works on a whole repository: open ${above} itself.`;
  return "This folder is not a git repository. gridd runs agents in git worktrees: open a repository's root folder, or run `git init` here and commit once.";
}

function repoAbove(dir: string): string | undefined {
  let d = path.dirname(dir);
  while (d !== path.dirname(d)) {
    if (fs.existsSync(path.join(d, ".git"))) return d;
    d = path.dirname(d);
  }
  return undefined;
}

export const buildSession: Build = (conn) => {
  const out = notConnected(conn);
  if (!conn.store.loaded) return out;
  const s = conn.state.session;
  const agents = conn.state.agents.length;
  const info = (label: string, description: string, icon: string, command?: vscode.Command): Node => ({ kind: "info", conn, label, description, icon, command });
  if (s.started) {
    out.push(info(`session: ${s.featureBranch ?? "HEAD"}`, "running", "play-circle", { title: "Stop", command: "gridd.stopSession", arguments: [conn] }));
  } else {
    out.push(info("session: stopped", s.stopReason ? stopReasonText(s.stopReason) : "start one from here", "debug-stop", { title: "Start", command: "gridd.startSession", arguments: [conn] }));
  }
  out.push(info("agents", agentsRow(agents, s.maxAgents, s.started), "hubot"));
  const spent = s.spentUsd ?? 0;
  out.push(info("spent", s.budgetUsd != null ? `${money(spent)} of ${money(s.budgetUsd)}` : money(spent), "credit-card"));
  const stats = conn.state.stats;
  const counts = STATUS_ORDER.map((k) => [k, stats[k === "rate_limited" ? "rateLimited" : k] ?? 0] as const).filter(([, n]) => n > 0);
  out.push(info("tasks", counts.map(([k, n]) => `${n} ${k}`).join(", ") || "none", "checklist"));
  if (conn.skew && !conn.skew.ok) out.push(info("version", conn.skew.message, "warning", { title: "Version", command: "gridd.showVersion", arguments: [conn] }));
  else if (conn.state.daemon.version) out.push(info("daemon", `gridd ${conn.state.daemon.version}`, "server-process"));
  return out;
};

export const buildTasks: Build = (conn) => {
  const out: Node[] = [];
  const tasks = conn.state.tasks;
  if (conn.store.loaded && tasks.length === 0) out.push({ kind: "info", conn, label: "no tasks", description: "add one with Gridd: Add Task", icon: "add", command: { title: "Add Task", command: "gridd.addTask", arguments: [conn] } });
  const groups = new Map<string, Task[]>();
  for (const t of tasks) groups.set(t.status, [...(groups.get(t.status) ?? []), t]);
  const order = [...STATUS_ORDER, ...[...groups.keys()].filter((k) => !STATUS_ORDER.includes(k))];
  for (const status of order) {
    const list = groups.get(status);
    if (list?.length) out.push({ kind: "group", conn, status, tasks: list.sort((a, b) => a.id.localeCompare(b.id)) });
  }
  return out;
};

export const buildAgents: Build = (conn) => [
  ...conn.state.agents.map((agent): Node => ({ kind: "agent", conn, agent })),
];

export const buildQuestions: Build = (conn) => [
  ...conn.state.pendingQuestions.map((question): Node => ({ kind: "question", conn, question })),
];

export const buildMerges: Build = (conn) => {
  const train = trainRows(conn.store.train, conn.state.tasks).map(
    (row): Node => ({ kind: "info", conn, label: row.label, description: row.description, icon: row.icon, tooltip: row.tooltip }),
  );
  const out: Node[] = [
    ...train,
    ...conn.state.tasks.filter((t) => t.status === "merging").map((task): Node => ({ kind: "task", conn, task })),
  ];
  for (const c of conn.conflicts) {
    const who = c.kind === "feature" ? `${(c.tasks ?? []).join(", ")} ↔ feature branch` : (c.tasks ?? []).join(" ↔ ");
    const predicted = c.predictedConflict ? ` · conflict predicted in ${(c.conflictFiles ?? c.files).join(", ")}` : "";
    out.push({
      kind: "info",
      conn,
      label: `overlap: ${who || "tasks"}`,
      description: `${c.files.join(", ")}${predicted}`,
      icon: c.predictedConflict ? "warning" : "git-compare",
      command: { title: "Details", command: "gridd.showConflict", arguments: [{ folder: conn.root, conflict: c }] },
      tooltip: `${c.kind ?? "tasks"}: both change ${c.files.join(", ")}${predicted}`,
    });
  }
  return out;
};

export function hasMerges(conns: Connections): boolean {
  return conns.all.some((c) => c.conflicts.length > 0 || c.state.tasks.some((t) => t.status === "merging"));
}

export function money(usd: number): string {
  return `$${usd.toFixed(2)}`;
}

function clock(iso: string): string {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleTimeString();
}
