/**
 * Starting gridd for a folder: `gridctl daemon start` (path from `gridd.gridctlPath`), run
 * when the user agrees, or at once when `gridd.autoStartDaemon` is on.
 */

import { execFile } from "node:child_process";

import * as vscode from "vscode";

import type { FolderConnection } from "./connection";

export function gridctlPath(): string {
  return vscode.workspace.getConfiguration("gridd").get<string>("gridctlPath") || "gridctl";
}

export async function offerOrStartDaemon(conn: FolderConnection, log: vscode.LogOutputChannel): Promise<void> {
  const auto = vscode.workspace.getConfiguration("gridd", conn.folder.uri).get<boolean>("autoStartDaemon", false);
  if (auto) {
    await startDaemon(conn, log);
    return;
  }
  const choice = await vscode.window.showInformationMessage(
    `gridd is not running in ${conn.name}.`,
    "Start gridd",
    "Always Start",
  );
  if (choice === "Always Start") {
    await vscode.workspace.getConfiguration("gridd", conn.folder.uri).update("autoStartDaemon", true, vscode.ConfigurationTarget.Workspace);
  }
  if (choice) await startDaemon(conn, log);
}

export function startDaemon(conn: FolderConnection, log: vscode.LogOutputChannel): Promise<boolean> {
  const exe = gridctlPath();
  log.info(`${conn.name}: ${exe} daemon start`);
  return new Promise((resolve) => {
    execFile(exe, ["daemon", "start"], { cwd: conn.root, timeout: 60_000 }, (error, stdout, stderr) => {
      if (stdout.trim()) log.info(stdout.trim());
      if (stderr.trim()) log.warn(stderr.trim());
      if (error) {
        const missing = (error as NodeJS.ErrnoException).code === "ENOENT";
        const message = missing
          ? `gridd: '${exe}' was not found. Set gridd.gridctlPath to the gridctl executable.`
          : `gridd: 'gridctl daemon start' failed: ${(stderr || error.message).trim().split("\n").pop() ?? ""}`;
        void vscode.window.showErrorMessage(message, missing ? "Open Settings" : "Show Log").then((c) => {
          if (c === "Open Settings") void vscode.commands.executeCommand("workbench.action.openSettings", "gridd.gridctlPath");
          if (c === "Show Log") log.show();
        });
        resolve(false);
        return;
      }
      conn.wake();
      resolve(true);
    });
  });
}
