/**
 * Questions from agents as notifications: the options are buttons, "Answer…" takes free
 * text. A question answered elsewhere (gridctl, another window) leaves the views at once
 * and its toast is hidden; a click on a stale toast says who was first instead of failing.
 */

import * as vscode from "vscode";

import { explain } from "../client/errors";
import type { Question } from "../client/types";
import type { FolderConnection } from "./connection";
import { showError } from "./feedback";

const FREE_TEXT = "Answer…";

export class QuestionPrompter implements vscode.Disposable {
  /** Questions currently shown as a toast, by connection root + id. */
  private readonly shown = new Set<string>();
  /** Every question ever prompted, so a snapshot does not prompt it again. */
  private readonly prompted = new Set<string>();

  enabled(): boolean {
    return vscode.workspace.getConfiguration("gridd").get<boolean>("notifyQuestions", true);
  }

  /** Prompt for new pending questions, and hide toasts of questions no longer pending. */
  sync(conn: FolderConnection): void {
    const pending = new Set(conn.state.pendingQuestions.map((q) => key(conn, q.id)));
    let gone = false;
    for (const k of [...this.shown]) {
      if (k.startsWith(`${conn.root}\0`) && !pending.has(k) && conn.store.loaded) {
        this.shown.delete(k);
        gone = true;
      }
    }
    if (gone && ![...this.shown].length) void vscode.commands.executeCommand("notifications.hideToasts");
    if (!this.enabled()) return;
    for (const q of conn.state.pendingQuestions) {
      const k = key(conn, q.id);
      if (this.prompted.has(k)) continue;
      this.prompted.add(k);
      this.shown.add(k);
      void this.prompt(conn, q).finally(() => this.shown.delete(k));
    }
  }

  private async prompt(conn: FolderConnection, q: Question): Promise<void> {
    const choice = await vscode.window.showInformationMessage(`${q.agentId} (${q.taskId}) asks: ${q.question}`, ...q.options, FREE_TEXT);
    if (choice === undefined) return;
    if (!conn.state.pendingQuestions.some((p) => p.id === q.id)) {
      void vscode.window.showInformationMessage(`gridd: ${q.id} was already answered elsewhere.`);
      return;
    }
    const answer = choice === FREE_TEXT ? await askFreeText(q) : choice;
    if (answer === undefined) return;
    await answerQuestion(conn, q, answer);
  }

  dispose(): void {
    this.shown.clear();
  }
}

export async function askFreeText(q: Question): Promise<string | undefined> {
  if (q.options.length) {
    return vscode.window.showQuickPick(q.options, { title: q.question, placeHolder: `answer ${q.agentId}` });
  }
  return vscode.window.showInputBox({ title: q.question, prompt: `answer ${q.agentId}`, ignoreFocusOut: true });
}

export async function answerQuestion(conn: FolderConnection, q: Question, answer: string): Promise<boolean> {
  try {
    await conn.call("POST", `/questions/${encodeURIComponent(q.id)}/answer`, { body: { response: answer } });
    vscode.window.setStatusBarMessage(`gridd: answered ${q.id}`, 3000);
    return true;
  } catch (error) {
    void showError(explain(error), conn);
    return false;
  }
}

function key(conn: FolderConnection, id: string): string {
  return `${conn.root}\0${id}`;
}
