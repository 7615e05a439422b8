/**
 * A task's change in VS Code's diff editor, file by file, against the commit it branched
 * from. `GET /tasks/{id}/diff` names the base, the head and the files; the left side is
 * `git show base:path`, the right side the task's worktree (or `head:path` once it is gone).
 */

import * as fs from "node:fs";
import * as path from "node:path";

import * as vscode from "vscode";

import { conflictFiles } from "../client/review";

import type { FolderConnection } from "./connection";
import { showAt } from "./git";

export const SCHEME = "gridd-git";

export interface TaskDiff {
  taskId: string;
  base: string;
  head: string;
  files: Array<{ path: string; status: string; additions?: number; deletions?: number }>;
  patch?: string;
}

/** Serves `gridd-git:/<path>?<json {root, rev}>` as the file's content at that commit. */
export class GitContentProvider implements vscode.TextDocumentContentProvider {
  provideTextDocumentContent(uri: vscode.Uri): Promise<string> {
    const { root, rev } = JSON.parse(uri.query) as { root: string; rev: string };
    return showAt(root, rev, uri.path.replace(/^\//, ""));
  }
}

export function gitUri(root: string, rev: string, file: string, taskId?: string): vscode.Uri {
  return vscode.Uri.from({ scheme: SCHEME, path: `/${file}`, query: JSON.stringify({ root, rev, taskId }) });
}

/** The task whose diff the active editor shows (its left side is one of our `gridd-git:` URIs), if any. */
export function activeDiffTask(): { root: string; taskId: string } | undefined {
  const input = vscode.window.tabGroups.activeTabGroup.activeTab?.input;
  if (!(input instanceof vscode.TabInputTextDiff) || input.original.scheme !== SCHEME) return undefined;
  try {
    const q = JSON.parse(input.original.query) as { root?: string; taskId?: string };
    return q.root && q.taskId ? { root: q.root, taskId: q.taskId } : undefined;
  } catch {
    return undefined;
  }
}

/** Keep the `gridd.inTaskDiff` context key (the diff editor's title-bar actions) in step with the active tab. */
export function trackTaskDiff(): vscode.Disposable {
  const update = (): void => {
    void vscode.commands.executeCommand("setContext", "gridd.inTaskDiff", activeDiffTask() !== undefined);
  };
  update();
  return vscode.window.tabGroups.onDidChangeTabs(update);
}

/** Open one file of the diff; returns the title of the editor it opened. */
export async function openFileDiff(conn: FolderConnection, diff: TaskDiff, file: string, worktree: string | null | undefined): Promise<string> {
  const left = gitUri(conn.root, diff.base, file, diff.taskId);
  // The worktree (editable, current) while the task is still its agent's; its head commit
  // once it is approved, since the merge queue may remove the worktree.
  const status = conn.store.task(diff.taskId)?.status;
  const live = status === "working" || status === "review";
  const wtFile = worktree && live ? path.resolve(conn.root, worktree, file) : undefined;
  const right = wtFile && fs.existsSync(wtFile) ? vscode.Uri.file(wtFile) : gitUri(conn.root, diff.head, file);
  const title = `${path.basename(file)} (${diff.taskId}: ${diff.base.slice(0, 7)} ↔ ${diff.head.slice(0, 7)})`;
  await vscode.commands.executeCommand("vscode.diff", left, right, title, { preview: false });
  return title;
}

export async function pickAndOpenDiff(conn: FolderConnection, taskId: string, file?: string): Promise<string[]> {
  const diff = await conn.call<TaskDiff>("GET", `/tasks/${encodeURIComponent(taskId)}/diff`);
  const worktree = conn.store.task(taskId)?.worktree;
  if (diff.files.length === 0) {
    void vscode.window.showInformationMessage(`gridd: ${taskId} changes nothing against ${diff.base.slice(0, 7)}.`);
    return [];
  }
  let files: string[];
  const task = conn.store.task(taskId);
  const conflicted = task ? conflictFiles(task) : [];
  if (file) files = [file];
  else if (conflicted.length) files = conflicted; // a conflicted task opens on its conflicted files
  else if (diff.files.length === 1 && diff.files[0]) files = [diff.files[0].path];
  else {
    const picked = await vscode.window.showQuickPick(
      diff.files.map((f) => ({ label: f.path, description: `${f.status} +${f.additions ?? 0} -${f.deletions ?? 0}`, picked: true })),
      { canPickMany: true, title: `${taskId}: files changed since ${diff.base.slice(0, 7)}` },
    );
    files = (picked ?? []).map((p) => p.label);
  }
  const titles: string[] = [];
  for (const f of files) titles.push(await openFileDiff(conn, diff, f, worktree));
  return titles;
}
