/**
 * Review as a flow of its own: a notification when a task reaches review (Diff, Approve,
 * Reject), a warning when the daemon refuses a merge for conflict markers, word of review
 * edits committed at approve, and the daemon's `review_edits` setting.
 *
 * What an approve does with uncommitted edits follows the daemon's `[merge] review_edits`,
 * as the daemon reports it in its state (`daemon.reviewEdits`), never guessed from a file.
 */

import * as vscode from "vscode";

import { askedAboutMerge, conflictMark, newlyInReview, reviewEditsMode, taskName, type ReviewEdits } from "../client/review";
import type { GriddEvent } from "../client/types";
import type { FolderConnection } from "./connection";

export function reviewEdits(conn: FolderConnection): ReviewEdits | undefined {
  return reviewEditsMode(conn.state);
}

export class ReviewNotifier implements vscode.Disposable {
  /** The statuses seen at the last sync, per connection; absent before its first snapshot. */
  private readonly seen = new Map<FolderConnection, Map<string, string>>();

  enabled(): boolean {
    return vscode.workspace.getConfiguration("gridd").get<boolean>("notifyReviews", true);
  }

  sync(conn: FolderConnection): void {
    if (!conn.connected) return;
    const tasks = conn.state.tasks;
    const fresh = newlyInReview(this.seen.get(conn), tasks);
    this.seen.set(conn, new Map(tasks.map((t) => [t.id, t.status] as const)));
    if (!this.enabled()) return;
    for (const t of fresh) {
      const mark = conflictMark(t, askedAboutMerge(conn.state, t.id));
      const text = !mark
        ? `gridd: ${t.title} (${t.id}) is ready for review.`
        : mark.cameBack
          ? `gridd: ${t.title} (${t.id}) is back in review after a merge conflict in ${mark.files.join(", ")}: its agent resolved it; check the resolution before approving.`
          : `gridd: ${t.title} (${t.id}) is back in review: ${mark.description}.`;
      const show = mark ? vscode.window.showWarningMessage : vscode.window.showInformationMessage;
      void show(text, "Diff", "Approve", "Reject").then((choice) => {
        const command = choice === "Diff" ? "gridd.openDiff" : choice === "Approve" ? "gridd.approveTask" : choice === "Reject" ? "gridd.rejectTask" : undefined;
        if (command) void vscode.commands.executeCommand(command, { folder: conn.root, taskId: t.id });
      });
    }
  }

  /** Events worth a word of their own. */
  onEvent(conn: FolderConnection, e: GriddEvent): void {
    const files = Array.isArray(e.data["files"]) ? (e.data["files"] as unknown[]).map(String) : [];
    const taskId = String(e.data["taskId"] ?? "");
    if (e.type === "task.merge_refused") {
      void vscode.window.showWarningMessage(
        `gridd: the merge of ${taskName(conn.state, taskId)} was refused: conflict markers in ${files.join(", ")}. It is back in review; resolve them, or approve again to let them through.`,
        "Diff",
      ).then((choice) => {
        if (choice) void vscode.commands.executeCommand("gridd.openDiff", { folder: conn.root, taskId, file: files[0] });
      });
    } else if (e.type === "task.review_edits") {
      vscode.window.setStatusBarMessage(`gridd: your edits to ${files.join(", ")} were committed on ${taskId}'s branch as a review commit`, 8000);
    } else if (e.type === "task.merge_failed") {
      void vscode.window.showErrorMessage(`gridd: the merge of ${taskName(conn.state, taskId)} failed: ${String(e.data["error"] ?? "")}`);
    }
  }

  dispose(): void {
    this.seen.clear();
  }
}
