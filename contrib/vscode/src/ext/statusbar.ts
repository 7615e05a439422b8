/** The status bar item: running agents, pending questions and spend; a click opens the view. */

import * as vscode from "vscode";

import type { Connections } from "./manager";
import { money } from "./views";

export class StatusItem implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem("gridd.status", vscode.StatusBarAlignment.Left, 50);

  constructor(private readonly conns: Connections) {
    this.item.name = "gridd";
    this.item.command = "gridd.focus";
    this.update();
  }

  update(): void {
    const all = this.conns.all;
    if (all.length === 0) {
      this.item.hide();
      return;
    }
    const live = all.filter((c) => c.connected);
    if (live.length === 0) {
      this.item.text = "$(debug-disconnect) gridd: not connected";
      this.item.tooltip = "gridd is not answering; the extension reconnects by itself";
      this.item.backgroundColor = undefined;
    } else {
      const agents = live.reduce((n, c) => n + c.state.agents.length, 0);
      const questions = live.reduce((n, c) => n + c.state.pendingQuestions.length, 0);
      const spent = live.reduce((n, c) => n + (c.state.session.spentUsd ?? 0), 0);
      this.item.text = `$(hubot) ${agents} $(question) ${questions} $(credit-card) ${money(spent)}`;
      this.item.tooltip = `gridd: ${agents} running agents, ${questions} pending questions, ${money(spent)} spent${live.length < all.length ? ` (${all.length - live.length} folder(s) not connected)` : ""}`;
      this.item.backgroundColor = questions ? new vscode.ThemeColor("statusBarItem.warningBackground") : undefined;
    }
    this.item.show();
  }

  dispose(): void {
    this.item.dispose();
  }
}
