/** Showing an explained error once, with its next action as the button that runs it. */

import * as vscode from "vscode";

import { explain, type Explained } from "../client/errors";
import type { FolderConnection } from "./connection";

export async function showError(x: Explained, conn?: FolderConnection): Promise<void> {
  const show =
    x.severity === "error" ? vscode.window.showErrorMessage : x.severity === "warning" ? vscode.window.showWarningMessage : vscode.window.showInformationMessage;
  const choice = await show(`gridd: ${x.message}`, ...(x.action ? [x.action.label] : []));
  if (choice && x.action) await vscode.commands.executeCommand(x.action.command, conn);
}

/** Run an action against gridd; any failure is explained to the user, never retried. */
export async function guarded<T>(conn: FolderConnection | undefined, fn: () => Promise<T>): Promise<T | undefined> {
  try {
    return await fn();
  } catch (error) {
    void showError(explain(error), conn); // not awaited: a command never waits on a toast
    return undefined;
  }
}
