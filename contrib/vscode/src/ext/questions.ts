/**
 * Questions from agents as notifications: the options are buttons, "Answer…" takes free
 * text (the options offered as suggestions). A question answered or closed elsewhere
 * (gridctl, another window, a stopped session) leaves the views at once and its toast is
 * hidden; a click on a toast that stayed in the notification centre says the true reason.
 */

import * as vscode from "vscode";

import { explain } from "../client/errors";
import { answerChoices, settledMessage, taskName } from "../client/review";
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
    // Hide first, then prompt: a new question's toast must not be hidden with the stale ones.
    const hidden = gone && ![...this.shown].length ? Promise.resolve(vscode.commands.executeCommand("notifications.hideToasts")).catch(() => undefined) : Promise.resolve();
    if (!this.enabled()) return;
    for (const q of conn.state.pendingQuestions) {
      const k = key(conn, q.id);
      if (this.prompted.has(k)) continue;
      this.prompted.add(k);
      this.shown.add(k);
      void hidden.then(() => this.prompt(conn, q)).finally(() => this.shown.delete(k));
    }
  }

  private async prompt(conn: FolderConnection, q: Question): Promise<void> {
    const choice = await vscode.window.showInformationMessage(`${taskName(conn.state, q.taskId)} asks: ${q.question}`, ...q.options, FREE_TEXT);
    if (choice === undefined) return;
    if (!conn.state.pendingQuestions.some((p) => p.id === q.id)) {
      void vscode.window.showInformationMessage(`gridd: ${settledMessage(q, conn.store.settled.get(q.id))}`);
      return;
    }
    const answer = choice === FREE_TEXT ? await askFreeText(q, taskName(conn.state, q.taskId)) : choice;
    if (answer === undefined) return;
    await answerQuestion(conn, q, answer);
  }

  dispose(): void {
    this.shown.clear();
  }
}

/** Ask for an answer: free text always, the question's options offered as suggestions.
 * `asker`: the task whose agent asks, as a person names it. */
export async function askFreeText(q: Question, asker: string): Promise<string | undefined> {
  if (!q.options.length) {
    return vscode.window.showInputBox({ title: q.question, prompt: `The answer for ${asker}`, ignoreFocusOut: true });
  }
  const pick = vscode.window.createQuickPick();
  pick.title = q.question;
  pick.placeholder = `Type an answer for ${asker}, or pick one of its options`;
  pick.ignoreFocusOut = true;
  const items = (typed: string): vscode.QuickPickItem[] =>
    answerChoices(q.options, typed).map((label) => (q.options.includes(label) ? { label } : { label, description: "your answer" }));
  pick.items = items("");
  return new Promise<string | undefined>((resolve) => {
    let done = false;
    const finish = (value: string | undefined): void => {
      if (done) return;
      done = true;
      resolve(value);
      pick.dispose();
    };
    pick.onDidChangeValue((typed) => {
      pick.items = items(typed);
    });
    pick.onDidAccept(() => {
      const chosen = pick.selectedItems[0]?.label ?? pick.activeItems[0]?.label ?? pick.value.trim();
      if (chosen) finish(chosen);
    });
    pick.onDidHide(() => finish(undefined));
    pick.show();
  });
}

export async function answerQuestion(conn: FolderConnection, q: Question, answer: string): Promise<boolean> {
  try {
    await conn.call("POST", `/questions/${encodeURIComponent(q.id)}/answer`, { body: { response: answer } });
    vscode.window.setStatusBarMessage(`gridd: answered ${taskName(conn.state, q.taskId)}: “${answer}”`, 3000);
    return true;
  } catch (error) {
    void showError(explain(error), conn);
    return false;
  }
}

function key(conn: FolderConnection, id: string): string {
  return `${conn.root}\0${id}`;
}
