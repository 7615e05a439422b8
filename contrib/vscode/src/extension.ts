/**
 * gridd for VS Code: the composition root. Builds the connections (one per git folder), the
 * views, the status bar item, question prompts and commands, and wires their updates.
 *
 * `activate` returns a small API (the connections and output followers) for other
 * extensions and for the in-extension-host tests.
 */

import * as vscode from "vscode";

import { AgentOutputs } from "./ext/agentOutput";
import { registerCommands } from "./ext/commands";
import type { FolderConnection } from "./ext/connection";
import { GitContentProvider, SCHEME, trackTaskDiff } from "./ext/diff";
import { Connections } from "./ext/manager";
import { QuestionPrompter } from "./ext/questions";
import { ReviewNotifier } from "./ext/reviewing";
import { StatusItem } from "./ext/statusbar";
import { GriddTree, bannerText, buildAgents, buildMerges, buildQuestions, buildSession, buildTasks, hasMerges, type Node } from "./ext/views";

export interface GriddApi {
  readonly connections: () => FolderConnection[];
  readonly outputs: AgentOutputs;
}

export function activate(ctx: vscode.ExtensionContext): GriddApi {
  const log = vscode.window.createOutputChannel("gridd", { log: true });
  const conns = new Connections(log);
  const outputs = new AgentOutputs();
  const prompter = new QuestionPrompter();
  const reviews = new ReviewNotifier();
  const status = new StatusItem(conns);
  ctx.subscriptions.push(log, conns, outputs, prompter, reviews, status);
  ctx.subscriptions.push(vscode.workspace.registerTextDocumentContentProvider(SCHEME, new GitContentProvider()), trackTaskDiff());

  const trees: Array<[string, GriddTree, vscode.TreeView<Node>]> = [];
  const view = (id: string, build: (c: FolderConnection) => Node[]): vscode.TreeView<Node> => {
    const tree = new GriddTree(conns, build);
    const tv = vscode.window.createTreeView(id, { treeDataProvider: tree, showCollapseAll: id === "gridd.tasks" });
    trees.push([id, tree, tv]);
    ctx.subscriptions.push(tv);
    return tv;
  };
  const sessionView = view("gridd.session", buildSession);
  view("gridd.tasks", buildTasks);
  view("gridd.agents", buildAgents);
  const questionsView = view("gridd.questions", buildQuestions);
  view("gridd.merges", buildMerges);

  let pending: NodeJS.Timeout | undefined;
  const render = (): void => {
    pending = undefined;
    for (const [, tree] of trees) tree.refresh();
    // One banner for the link's state, at the top of the container (the Session view).
    sessionView.message = bannerText(conns);
    const questions = conns.all.reduce((n, c) => n + (c.connected ? c.state.pendingQuestions.length : 0), 0);
    const inReview = conns.all.reduce((n, c) => n + (c.connected ? c.state.tasks.filter((t) => t.status === "review").length : 0), 0);
    const waiting = questions + inReview;
    questionsView.badge = waiting ? { value: waiting, tooltip: `gridd: ${questions} question(s) waiting for an answer, ${inReview} task(s) in review` } : undefined;
    void vscode.commands.executeCommand("setContext", "gridd.hasMerges", hasMerges(conns));
    void vscode.commands.executeCommand("setContext", "gridd.connected", conns.all.some((c) => c.connected));
    status.update();
    for (const c of conns.all) {
      prompter.sync(c);
      reviews.sync(c);
    }
  };
  // Output events can arrive by the thousand: coalesce renders to one per 100 ms.
  conns.onDidChange(() => {
    if (!pending) pending = setTimeout(render, 100);
  });
  const warned = new Set<FolderConnection>();
  conns.onDidAdd((conn) => {
    conn.onEvent((e) => reviews.onEvent(conn, e));
    conn.onLink((state) => {
      if (state === "connected" && conn.skew === undefined) warned.delete(conn);
    });
    conn.onDidChange(() => {
      if (conn.skew && !conn.skew.ok && !warned.has(conn)) {
        warned.add(conn);
        void vscode.window.showWarningMessage(`gridd (${conn.name}): ${conn.skew.message}`);
      }
    });
  });

  registerCommands(ctx, conns, outputs);
  conns.sync();
  render();
  ctx.subscriptions.push({ dispose: () => pending && clearTimeout(pending) });
  return { connections: () => conns.all, outputs };
}

export function deactivate(): void {
  // Everything is disposed through the context's subscriptions.
}
