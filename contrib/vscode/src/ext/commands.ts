/**
 * The extension's commands: session, tasks, agents, questions, diff and daemon actions.
 *
 * Each command takes what the tree passes (a node), or a plain object naming its target
 * (`{taskId, folder?, ...}`: keybindings, other extensions, tests), or nothing, in which
 * case it asks with quick picks. Every gridd error is explained once; nothing is retried.
 */

import * as fs from "node:fs";
import * as path from "node:path";

import * as vscode from "vscode";

import type { Agent, Conflict, Task } from "../client/types";
import type { AgentOutputs } from "./agentOutput";
import type { FolderConnection } from "./connection";
import { startDaemon } from "./daemon";
import { activeDiffTask, pickAndOpenDiff } from "./diff";
import { guarded } from "./feedback";
import { branches } from "./git";
import type { Connections } from "./manager";
import { cancelImpact, conflictMark, proposeBranch, reviewEditsNote, stopSessionImpact, taskName, unsavedEditsNote } from "../client/review";
import { answerQuestion, askFreeText } from "./questions";
import { reviewEdits } from "./reviewing";
import type { Node } from "./views";

/** What a command may be handed instead of a tree node. */
export interface Target {
  folder?: string;
  taskId?: string;
  agentId?: string;
  questionId?: string;
  branch?: string;
  feedback?: string;
  /** Skip the confirmation (other extensions, tests that already confirmed). */
  confirmed?: boolean;
  text?: string;
  file?: string;
  title?: string;
  prompt?: string;
  dependsOn?: string[];
}

type Arg = Node | FolderConnection | Target | vscode.Uri | undefined;

export function registerCommands(ctx: vscode.ExtensionContext, conns: Connections, outputs: AgentOutputs): void {
  const reg = (id: string, fn: (arg: Arg, ...rest: unknown[]) => unknown): void => {
    ctx.subscriptions.push(vscode.commands.registerCommand(id, fn));
  };
  const connOf = async (arg: Arg): Promise<FolderConnection | undefined> => {
    if (!arg) return conns.pick();
    if (arg instanceof vscode.Uri) return conns.forFolder(arg);
    if ("follower" in arg) return arg; // a FolderConnection
    if ("kind" in arg && "conn" in arg && arg.conn) return arg.conn;
    const target = arg as Target;
    if (target.folder) return conns.all.find((c) => c.root === target.folder || c.name === target.folder);
    return conns.pick();
  };
  const targetOf = (arg: Arg): Target => (arg && !(arg instanceof vscode.Uri) && !("kind" in arg) && !("follower" in arg) ? (arg as Target) : {});

  const taskOf = async (arg: Arg, statuses: string[] | undefined, verb: string): Promise<{ conn: FolderConnection; task: Task } | undefined> => {
    if (arg && "kind" in arg && arg.kind === "task") return { conn: arg.conn, task: arg.task };
    // From the diff editor's title bar (VS Code passes the file's URI): the task of that diff.
    const inDiff = arg instanceof vscode.Uri ? activeDiffTask() : undefined;
    const diffConn = inDiff && conns.all.find((c) => c.root === inDiff.root);
    if (inDiff && diffConn) {
      const task = diffConn.store.task(inDiff.taskId);
      if (task && (!statuses || statuses.includes(task.status))) return { conn: diffConn, task };
    }
    const conn = await connOf(arg);
    if (!conn) return undefined;
    const t = targetOf(arg);
    if (t.taskId) {
      const task = conn.store.task(t.taskId) ?? ({ id: t.taskId, title: t.taskId, status: "?", dependsOn: [], attempts: 0 } as Task);
      return { conn, task };
    }
    const candidates = conn.state.tasks.filter((x) => !statuses || statuses.includes(x.status));
    if (candidates.length === 0) {
      void vscode.window.showInformationMessage(`gridd: no task to ${verb}${statuses ? ` (none is ${statuses.join(" or ")})` : ""}.`);
      return undefined;
    }
    const picked = await vscode.window.showQuickPick(
      candidates.map((task) => ({ label: task.id, description: `${task.status} · ${task.title}`, task })),
      { placeHolder: `Task to ${verb}` },
    );
    return picked ? { conn, task: picked.task } : undefined;
  };

  const agentOf = async (arg: Arg, verb: string): Promise<{ conn: FolderConnection; agent: Agent } | undefined> => {
    if (arg && "kind" in arg && arg.kind === "agent") return { conn: arg.conn, agent: arg.agent };
    if (arg && "kind" in arg && arg.kind === "task") {
      const agent = arg.conn.state.agents.find((a) => a.taskId === arg.task.id);
      if (agent) return { conn: arg.conn, agent };
      const all = await arg.conn.call<Agent[]>("GET", "/agents?all=1").catch(() => [] as Agent[]);
      const last = all.filter((a) => a.taskId === arg.task.id).pop();
      if (last) return { conn: arg.conn, agent: last };
      void vscode.window.showInformationMessage(`gridd: task ${arg.task.id} has had no agent yet.`);
      return undefined;
    }
    const conn = await connOf(arg);
    if (!conn) return undefined;
    const t = targetOf(arg);
    if (t.agentId) return { conn, agent: conn.store.agent(t.agentId) ?? ({ id: t.agentId, taskId: "", status: "?" } as Agent) };
    if (t.taskId) {
      const agent = conn.state.agents.find((a) => a.taskId === t.taskId);
      if (agent) return { conn, agent };
    }
    const agents = conn.state.agents;
    if (agents.length === 0) {
      void vscode.window.showInformationMessage(`gridd: no running agent to ${verb}.`);
      return undefined;
    }
    const picked = await vscode.window.showQuickPick(
      agents.map((agent) => ({ label: taskName(conn.state, agent.taskId), description: agent.status, agent })),
      { placeHolder: `Agent to ${verb}` },
    );
    return picked ? { conn, agent: picked.agent } : undefined;
  };

  const taskCall = (id: string, statuses: string[] | undefined, verb: string, method: string, suffix: string, done: string): void =>
    reg(id, async (arg) => {
      const sel = await taskOf(arg, statuses, verb);
      if (!sel) return undefined;
      const result = await guarded(sel.conn, () => sel.conn.call<Task>(method, `/tasks/${encodeURIComponent(sel.task.id)}${suffix}`));
      if (result) vscode.window.setStatusBarMessage(`gridd: ${sel.task.id} ${done}`, 3000);
      return result;
    });

  // -- daemon and views ----------------------------------------------------------------------
  reg("gridd.refresh", async (arg) => {
    const targets = arg ? [await connOf(arg)] : conns.all;
    for (const c of targets) {
      if (!c) continue;
      c.wake();
      await c.refresh();
    }
  });
  reg("gridd.showLog", () => conns.log.show());
  reg("gridd.focus", () => vscode.commands.executeCommand("workbench.view.extension.gridd"));
  reg("gridd.startDaemon", async (arg) => {
    const conn = await connOf(arg);
    return conn ? startDaemon(conn, conns.log) : false;
  });
  reg("gridd.showVersion", async (arg) => {
    const conn = await connOf(arg);
    if (!conn) return;
    const body = await guarded(conn, () => conn.call<Record<string, unknown>>("GET", "/version"));
    if (body) void vscode.window.showInformationMessage(`gridd ${String(body["version"])} (API ${String(body["apiVersion"])}, pid ${String(body["pid"])}). ${conn.skew?.message ?? ""}`);
  });

  // -- session ------------------------------------------------------------------------------
  reg("gridd.startSession", async (arg) => {
    const conn = await connOf(arg);
    if (!conn) return undefined;
    let branch = targetOf(arg).branch;
    if (branch === undefined) {
      // gridd refuses the checked-out branch: propose a new one, offer the others.
      const [current, ...others] = await branches(conn.root).catch(() => [] as string[]);
      const proposed = proposeBranch(current === undefined ? others : [current, ...others]);
      const NEW = `$(add) New branch ${proposed}`;
      const OTHER = "$(edit) Another new branch…";
      const items = [NEW, OTHER, ...others];
      const picked = await vscode.window.showQuickPick(items, {
        placeHolder: `Feature branch the tasks merge into (not ${current ?? "the checked-out branch"}: it is checked out)`,
        title: "Gridd: Start Session",
      });
      if (picked === undefined) return undefined;
      branch = picked === NEW ? proposed : picked === OTHER ? await vscode.window.showInputBox({ prompt: "New feature branch name", value: proposed }) : picked;
      if (!branch) return undefined;
    }
    return guarded(conn, () => conn.call("POST", "/session/start", { body: { featureBranch: branch } }));
  });
  reg("gridd.stopSession", async (arg) => {
    const conn = await connOf(arg);
    if (!conn) return undefined;
    if (!targetOf(arg).confirmed) {
      const ok = await vscode.window.showWarningMessage("Stop the gridd session?", { modal: true, detail: stopSessionImpact(conn.state) }, "Stop Session");
      if (ok !== "Stop Session") return undefined;
    }
    return guarded(conn, () => conn.call("POST", "/session/stop"));
  });

  // -- tasks ------------------------------------------------------------------------------------
  reg("gridd.addTask", async (arg) => {
    const conn = await connOf(arg);
    if (!conn) return undefined;
    const t = targetOf(arg);
    const title = t.title ?? (await vscode.window.showInputBox({ prompt: "Task title", ignoreFocusOut: true }));
    if (!title) return undefined;
    // The prompt is often several paragraphs: written in an editor, not a one-line box.
    const prompt =
      t.prompt ??
      (await writeInEditor({
        head: `Prompt for the agent of "${title}": what should it do? Write it below (empty: the title is the prompt), then press Add Task in the notification.`,
        ask: `gridd: write the prompt for "${title}" in the editor, then add the task.`,
        button: "Add Task",
      }));
    if (prompt === undefined) return undefined;
    let deps = t.dependsOn;
    if (deps === undefined && conn.state.tasks.length) {
      const picked = await vscode.window.showQuickPick(
        conn.state.tasks.filter((x) => x.status !== "cancelled").map((x) => ({ label: x.id, description: `${x.status} · ${x.title}` })),
        { canPickMany: true, placeHolder: "Depends on (none: press Enter)" },
      );
      if (picked === undefined) return undefined;
      deps = picked.map((p) => p.label);
    }
    return guarded(conn, () => conn.call<Task>("POST", "/tasks", { body: { title, prompt, dependsOn: deps ?? [] } }));
  });
  reg("gridd.loadPlan", async (arg) => {
    const uri = arg instanceof vscode.Uri ? arg : (await vscode.window.showOpenDialog({ filters: { Plans: ["yaml", "yml", "json"] } }))?.[0];
    if (!uri) return undefined;
    const conn = conns.forFolder(uri) ?? (await conns.pick());
    if (!conn) return undefined;
    const text = fs.readFileSync(uri.fsPath, "utf8");
    const yaml = /\.ya?ml$/i.test(uri.fsPath);
    const result = await guarded(conn, () =>
      conn.call<{ waves: string[][] }>("POST", "/plans", yaml ? { raw: { text, contentType: "application/yaml" } } : { raw: { text, contentType: "application/json" } }),
    );
    if (result) void vscode.window.showInformationMessage(`gridd: loaded ${path.basename(uri.fsPath)}: ${result.waves.flat().length} tasks in ${result.waves.length} waves.`);
    return result;
  });
  taskCall("gridd.startTask", ["ready", "pending", "failed", "blocked"], "start", "POST", "/start", "started");
  taskCall("gridd.retryTask", ["failed", "blocked"], "retry", "POST", "/start", "restarted");
  taskCall("gridd.stopTask", ["working"], "stop", "POST", "/stop", "stopped");
  reg("gridd.cancelTask", async (arg) => {
    const sel = await taskOf(arg, undefined, "cancel");
    if (!sel) return undefined;
    if (!targetOf(arg).confirmed) {
      const ok = await vscode.window.showWarningMessage(`Cancel ${sel.task.id} (${sel.task.title})?`, { modal: true, detail: cancelImpact(sel.conn.state, sel.task.id) }, "Cancel Task");
      if (ok !== "Cancel Task") return undefined;
    }
    const result = await guarded(sel.conn, () => sel.conn.call<Task>("DELETE", `/tasks/${encodeURIComponent(sel.task.id)}`));
    if (result) vscode.window.setStatusBarMessage(`gridd: ${sel.task.id} cancelled`, 3000);
    return result;
  });
  reg("gridd.approveTask", async (arg) => {
    const sel = await taskOf(arg, ["review"], "approve");
    if (!sel) return undefined;
    const task = sel.conn.store.task(sel.task.id) ?? sel.task;
    const mark = conflictMark(task);
    const markers = mark?.unresolved ?? [];
    const body: Record<string, unknown> = {};
    if (mark && !targetOf(arg).confirmed) {
      const detail = [
        markers.length ? `Conflict markers are still in ${markers.join(", ")}; approving lets them through to the feature branch.` : "",
        task.mergeConflict?.length ? `Its merge conflicted in ${task.mergeConflict.join(", ")}${mark.cameBack ? "; its agent resolved it: check the resolution in the diff" : ""}.` : "",
        reviewEditsNote(reviewEdits(sel.conn)),
      ].filter(Boolean).join("\n\n");
      const title = markers.length
        ? `${task.id} has unresolved conflicts in ${mark.files.join(", ")}. Approve anyway?`
        : `${task.id}: its merge conflicted in ${mark.files.join(", ")}. Approve it now?`;
      const ok = await vscode.window.showWarningMessage(title, { modal: true, detail }, "Approve Anyway");
      if (ok !== "Approve Anyway") return undefined;
    }
    if (!targetOf(arg).confirmed && !(await settleUnsavedEdits(sel.conn, task))) return undefined;
    if (markers.length) body["acceptMarkers"] = markers;
    const result = await guarded(sel.conn, () => sel.conn.call<Task>("POST", `/tasks/${encodeURIComponent(task.id)}/approve`, Object.keys(body).length ? { body } : undefined));
    if (result) vscode.window.setStatusBarMessage(`gridd: ${task.id} approved`, 3000);
    return result;
  });
  reg("gridd.rejectTask", async (arg) => {
    const sel = await taskOf(arg, ["review"], "reject");
    if (!sel) return undefined;
    const feedback = targetOf(arg).feedback ?? (await writeFeedback(sel.task));
    if (!feedback) return undefined;
    return guarded(sel.conn, () => sel.conn.call<Task>("POST", `/tasks/${encodeURIComponent(sel.task.id)}/reject`, { body: { feedback } }));
  });
  reg("gridd.openDiff", async (arg) => {
    const sel = await taskOf(arg, ["review", "merging", "done", "working", "failed", "blocked"], "show the diff of");
    if (!sel) return undefined;
    return guarded(sel.conn, () => pickAndOpenDiff(sel.conn, sel.task.id, targetOf(arg).file));
  });
  reg("gridd.openWorktree", async (arg) => {
    const sel = await taskOf(arg, undefined, "open the worktree of");
    if (!sel) return undefined;
    const task = sel.conn.store.task(sel.task.id) ?? sel.task;
    if (!task.worktree) {
      void vscode.window.showInformationMessage(`gridd: ${task.id} has no worktree yet (it gets one when an agent starts).`);
      return undefined;
    }
    const dir = path.resolve(sel.conn.root, task.worktree);
    return vscode.commands.executeCommand("vscode.openFolder", vscode.Uri.file(dir), { forceNewWindow: true });
  });

  // -- agents ------------------------------------------------------------------------------------
  reg("gridd.followOutput", async (arg) => {
    const sel = await agentOf(arg, "follow");
    if (!sel) return undefined;
    await outputs.follow(sel.conn, sel.agent.id, sel.agent.taskId || undefined);
    return sel.agent.id;
  });
  reg("gridd.sendFollowUp", async (arg) => {
    const sel = await agentOf(arg, "message");
    if (!sel) return undefined;
    const text = targetOf(arg).text ?? (await vscode.window.showInputBox({ title: `Message the agent working on ${taskName(sel.conn.state, sel.agent.taskId)}`, prompt: "Sent to the agent as its next input", ignoreFocusOut: true }));
    if (!text) return undefined;
    return guarded(sel.conn, () => sel.conn.call("POST", `/agents/${encodeURIComponent(sel.agent.id)}/respond`, { body: { response: text } }));
  });
  reg("gridd.killAgent", async (arg) => {
    const sel = await agentOf(arg, "kill");
    if (!sel) return undefined;
    const ok = await vscode.window.showWarningMessage(`Kill the agent working on ${taskName(sel.conn.state, sel.agent.taskId)}?`, { modal: true, detail: "Its task becomes blocked until you retry it." }, "Kill");
    if (ok !== "Kill") return undefined;
    return guarded(sel.conn, () => sel.conn.call("POST", `/agents/${encodeURIComponent(sel.agent.id)}/kill`));
  });

  // -- conflicts ------------------------------------------------------------------------------------
  reg("gridd.showConflict", async (arg) => {
    const c = (arg as { conflict?: Conflict } | undefined)?.conflict;
    const conn = await connOf(arg);
    if (!c || !conn) return undefined;
    const tasks = c.tasks ?? [];
    const who = c.kind === "feature" ? `${tasks.join(", ")} and what landed on the feature branch` : tasks.join(" and ");
    const detail = [
      `Both change: ${c.files.join(", ")}.`,
      c.predictedConflict ? `git merge-tree predicts a conflict in ${(c.conflictFiles ?? c.files).join(", ")}.` : "No conflict is predicted yet: the same files, merged cleanly so far.",
    ].join("\n");
    const buttons = tasks.map((t) => `Diff of ${t}`);
    const choice = await vscode.window.showInformationMessage(`gridd: ${who} overlap`, { modal: true, detail }, ...buttons);
    const taskId = choice?.replace(/^Diff of /, "");
    if (!taskId) return undefined;
    return vscode.commands.executeCommand("gridd.openDiff", { folder: conn.root, taskId, file: (c.conflictFiles ?? c.files)[0] });
  });

  // -- questions ----------------------------------------------------------------------------------
  reg("gridd.answerQuestion", async (arg) => {
    let conn: FolderConnection | undefined;
    let questionId: string | undefined;
    if (arg && "kind" in arg && arg.kind === "question") {
      conn = arg.conn;
      questionId = arg.question.id;
    } else {
      conn = await connOf(arg);
      questionId = targetOf(arg).questionId;
    }
    if (!conn) return false;
    const pending = conn.state.pendingQuestions;
    let q = pending.find((x) => x.id === questionId);
    if (!q) {
      if (pending.length === 0) {
        void vscode.window.showInformationMessage("gridd: no pending question.");
        return false;
      }
      const picked = await vscode.window.showQuickPick(pending.map((x) => ({ label: x.question, description: taskName(conn.state, x.taskId), q: x })), { placeHolder: "Question to answer" });
      q = picked?.q;
    }
    if (!q) return false;
    const answer = targetOf(arg).text ?? (await askFreeText(q, taskName(conn.state, q.taskId)));
    return answer === undefined ? false : answerQuestion(conn, q, answer);
  });
}

const DRAFT_HEAD = /^<!--[\s\S]*?-->/;

/**
 * Multi-line text (feedback, a prompt): written in an untitled editor below a comment that
 * says what to write (not sent), and taken with the notification's button. Undefined when
 * the user cancels; "" when nothing was written.
 */
async function writeInEditor(o: { head: string; ask: string; button: string }): Promise<string | undefined> {
  const doc = await vscode.workspace.openTextDocument({ language: "markdown", content: `<!-- ${o.head} This comment is not sent. -->\n\n` });
  const editor = await vscode.window.showTextDocument(doc, { preview: false });
  const end = doc.lineAt(doc.lineCount - 1).range.end;
  editor.selection = new vscode.Selection(end, end);
  const choice = await vscode.window.showInformationMessage(o.ask, o.button, "Cancel");
  const text = doc.getText().replace(DRAFT_HEAD, "").trim();
  // Close the draft without a save prompt.
  if (!doc.isClosed) {
    await vscode.window.showTextDocument(doc, { preview: false });
    await vscode.commands.executeCommand("workbench.action.revertAndCloseActiveEditor");
  }
  return choice === o.button ? text : undefined;
}

/** Multi-line reject feedback. */
async function writeFeedback(task: Task): Promise<string | undefined> {
  const text = await writeInEditor({
    head: `Feedback for ${task.id} (${task.title}): what should the agent change? Write it below, then press Send Feedback in the notification.`,
    ask: `gridd: write the feedback for ${task.id} in the editor, then send it.`,
    button: "Send Feedback",
  });
  if (text === "") {
    void vscode.window.showInformationMessage(`gridd: no feedback written; ${task.id} stays in review.`);
    return undefined;
  }
  return text;
}

/**
 * Before an approve: edits made in the task's worktree (the right side of its diff) but not
 * saved are not seen by gridd. Say so, with what the daemon does with saved ones, and save
 * them on request. False: the user cancelled.
 */
async function settleUnsavedEdits(conn: FolderConnection, task: Task): Promise<boolean> {
  if (!task.worktree) return true;
  const worktree = path.resolve(conn.root, task.worktree);
  const unsaved = vscode.workspace.textDocuments.filter((d) => d.isDirty && d.uri.scheme === "file" && d.uri.fsPath.startsWith(worktree + path.sep));
  if (!unsaved.length) return true;
  const files = unsaved.map((d) => path.relative(worktree, d.uri.fsPath));
  const SAVE = "Save and Approve";
  const choice = await vscode.window.showWarningMessage(
    `Your edits to ${files.join(", ")} in ${task.id}'s worktree are not saved.`,
    { modal: true, detail: unsavedEditsNote(reviewEdits(conn)) },
    SAVE,
    "Approve Without Them",
  );
  if (choice === undefined) return false;
  if (choice === SAVE) {
    for (const d of unsaved) {
      if (!(await d.save())) {
        void vscode.window.showErrorMessage(`gridd: ${path.relative(worktree, d.uri.fsPath)} could not be saved; ${task.id} was not approved.`);
        return false;
      }
    }
  }
  return true;
}
