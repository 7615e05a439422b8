/**
 * What the editor says about review, questions, sessions and the link, as pure functions of
 * the daemon's state (no vscode import, so the node test runner covers them).
 */

import type { Question, RepoState, Task } from "./types";

/** How a question stopped being pending, as the event stream said. */
export interface Settled {
  how: "answered" | "closed";
  /** question.closed's reason (or "the agent ended"). */
  reason?: string;
}

/** What a click on a stale question toast says: the true reason, never a guess. */
export function settledMessage(q: Pick<Question, "question" | "taskId">, settled: Settled | undefined): string {
  const what = `“${q.question}” (${q.taskId})`;
  if (settled?.how === "answered") return `${what} was already answered elsewhere.`;
  if (settled?.how === "closed") return `${what} is no longer asked: ${closedReason(settled.reason)}.`;
  return `${what} is no longer pending.`;
}

/** question.closed's reason is a sentence ("the agent was stopped: session stopped"). */
function closedReason(reason: string | undefined): string {
  return reason ? reason : "it was closed";
}

/** A task as a person names it: its title and id ("Add login (login)"), or the id alone. */
export function taskName(state: Pick<RepoState, "tasks">, taskId: string): string {
  const title = state.tasks.find((t) => t.id === taskId)?.title;
  return title && title !== taskId ? `${title} (${taskId})` : taskId;
}

/** Why a session stopped, in words (the daemon's `stopReason` codes). */
export function stopReasonText(reason: string): string {
  const words: Record<string, string> = {
    user: "stopped by hand",
    budget_exhausted: "its budget ran out",
    no_work: "every task settled",
    stop_file: "a stop file asked for it",
    shutdown: "the daemon was stopped with its agents",
    error: "an error stopped it",
  };
  return words[reason] ?? reason.replace(/_/g, " ");
}

/** The answers a question's pick offers: what was typed first (free text), then the options. */
export function answerChoices(options: readonly string[], typed: string): string[] {
  const t = typed.trim();
  if (!t || options.includes(t)) return [...options];
  return [t, ...options];
}

/** The files a task is marked for: conflicts that came back and unresolved markers. */
export function conflictFiles(t: Task): string[] {
  const files = [...stringList(t["conflictUnresolved"]), ...(t.mergeConflict ?? [])];
  return [...new Set(files)];
}

/** How a task's row is marked for conflicts (none once it is merging, done or cancelled). */
export interface ConflictMark {
  /** Every file concerned, each once: unresolved markers first, then the merge's. */
  readonly files: string[];
  /** Files that still hold conflict markers (or unmerged entries). */
  readonly unresolved: string[];
  /** True for a merge conflict that went back to its agent and came back resolved. */
  readonly cameBack: boolean;
  /** The row's words. */
  readonly description: string;
  /** What gridd told the agent about the conflict (the task's feedback), for the tooltip. */
  readonly message?: string;
}

/**
 * The mark of a task whose merge conflicted or that holds conflict markers. A conflict sent
 * back to its agent (`[merge] on_conflict = "agent"`) and returned to review is not
 * "unresolved": its agent resolved it, and the reviewer should check how.
 * `askedAboutMerge`: gridd's own merge question for it is pending (on_conflict = "human").
 */
export function conflictMark(t: Task, askedAboutMerge = false): ConflictMark | undefined {
  if (["merging", "done", "cancelled"].includes(t.status)) return undefined;
  const unresolved = stringList(t["conflictUnresolved"]);
  const merged = t.mergeConflict ?? [];
  const files = [...new Set([...unresolved, ...merged])];
  if (!files.length) return undefined;
  const message = typeof t["feedback"] === "string" && merged.length ? t["feedback"] : undefined;
  const list = files.join(", ");
  if (unresolved.length) return { files, unresolved, cameBack: false, description: `unresolved conflict in ${unresolved.join(", ")}`, message };
  if (askedAboutMerge) return { files, unresolved, cameBack: false, description: `merge conflict in ${list}: gridd asks what to do`, message };
  if (t.status === "working") return { files, unresolved, cameBack: false, description: `merge conflict in ${list}: back with its agent to resolve`, message };
  if (t.status === "review") return { files, unresolved, cameBack: true, description: `was a merge conflict in ${list}, resolved by its agent: check it`, message };
  return { files, unresolved, cameBack: false, description: `merge conflict in ${list}`, message };
}

/** gridd's own merge question for this task is waiting (`[merge] on_conflict = "human"`). */
export function askedAboutMerge(state: Pick<RepoState, "pendingQuestions">, taskId: string): boolean {
  return state.pendingQuestions.some((q) => q.taskId === taskId && q.type === "merge_conflict");
}

function stringList(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : [];
}

export type ReviewEdits = "commit" | "refuse";

/** The daemon's `[merge] review_edits`, as it reports it (`daemon.reviewEdits` in its state);
 * undefined for a gridd too old to say. */
export function reviewEditsMode(state: Pick<RepoState, "daemon">): ReviewEdits | undefined {
  const mode = state.daemon.reviewEdits;
  return mode === "commit" || mode === "refuse" ? mode : undefined;
}

/** One sentence on what an approve does with edits made in the task's worktree. */
export function reviewEditsNote(mode: ReviewEdits | undefined): string {
  if (mode === "refuse") return "Uncommitted edits in its worktree stop the approve (review_edits = refuse): commit or discard them first.";
  if (mode === "commit") return "Uncommitted edits in its worktree are committed on its branch as a review commit and merged with it (review_edits = commit).";
  return "What the approve does with uncommitted edits in its worktree depends on the daemon's [merge] review_edits (this gridd does not report it; upgrade it to see it here).";
}

/** What becomes of edits made in a task's worktree but not saved, when it is approved. */
export function unsavedEditsNote(mode: ReviewEdits | undefined): string {
  const unsaved = "Not saved, they are not part of what is approved (gridd sees only saved files) and stay in the editor.";
  if (mode === "commit") return `Saved, they are committed on its branch as a review commit and merged with it (review_edits = commit). ${unsaved}`;
  if (mode === "refuse") return `Saved, they stop the approve until you commit or discard them (review_edits = refuse). ${unsaved}`;
  return `Saved, what the approve does with them depends on the daemon's [merge] review_edits. ${unsaved}`;
}

/** Tasks that reached review since `before` (ids and statuses seen last time). */
export function newlyInReview(before: ReadonlyMap<string, string> | undefined, tasks: readonly Task[]): Task[] {
  if (!before) return [];
  return tasks.filter((t) => t.status === "review" && before.get(t.id) !== "review");
}

/** A feature branch name for a new session: not the checked-out branch, not an existing one. */
export function proposeBranch(existing: readonly string[], now: Date = new Date()): string {
  const day = now.toISOString().slice(0, 10);
  const taken = new Set(existing);
  const base = `feature/session-${day}`;
  if (!taken.has(base)) return base;
  for (let n = 2; ; n++) if (!taken.has(`${base}-${n}`)) return `${base}-${n}`;
}

/** What stopping the session stops: its running agents and the questions they wait on. */
export function stopSessionImpact(s: RepoState): string {
  const agents = s.agents.length;
  const questions = s.pendingQuestions.length;
  if (!agents && !questions) return "No agent is running.";
  const parts = [plural(agents, "running agent")];
  if (questions) parts.push(`${plural(questions, "question")} waiting for an answer`);
  return `This stops ${parts.join(" and ")}.`;
}

/** What cancelling a task affects: its agent, its questions, the tasks that wait on it. */
export function cancelImpact(s: RepoState, taskId: string): string {
  const agents = s.agents.filter((a) => a.taskId === taskId).length;
  const questions = s.pendingQuestions.filter((q) => q.taskId === taskId).length;
  const dependants = s.tasks.filter((t) => t.dependsOn.includes(taskId) && !["done", "cancelled"].includes(t.status)).length;
  const parts: string[] = [];
  if (agents) parts.push(`stops ${plural(agents, "running agent")}`);
  if (questions) parts.push(`drops ${plural(questions, "waiting question")}`);
  if (dependants) parts.push(`leaves ${plural(dependants, "dependent task")} waiting on it`);
  return parts.length ? `This ${parts.join(", ")}.` : "No agent is working on it.";
}

export function plural(n: number, what: string): string {
  return `${n} ${what}${n === 1 ? "" : "s"}`;
}

/** The link's states as the user sees them: one banner each. */
export type LinkBanner = "no-repo" | "not-running" | "connecting" | "connected" | "stopped" | "version-mismatch";

export interface LinkFacts {
  gitRepo: boolean;
  connected: boolean;
  everConnected: boolean;
  socketExists: boolean;
  /** The daemon said it was stopping (a clean `gridctl daemon stop`), or the socket went with it. */
  stoppedOnPurpose: boolean;
  versionOk: boolean;
}

export function linkBanner(f: LinkFacts): LinkBanner {
  if (!f.gitRepo) return "no-repo";
  if (f.connected) return f.versionOk ? "connected" : "version-mismatch";
  if (f.stoppedOnPurpose) return "stopped";
  if (!f.socketExists) return f.everConnected ? "stopped" : "not-running";
  return "connecting";
}

/** The Session view's agents row: what the daemon counts (every live agent) against its limit. */
export function agentsRow(running: number, maxAgents: number, sessionStarted: boolean): string {
  if (!sessionStarted) return running ? `${running} running (no session: started by hand)` : "none running";
  if (running > maxAgents) return `${running} running: ${running - maxAgents} over the session's limit of ${maxAgents} (started by hand); no new one starts until below it`;
  return `${running} of ${maxAgents}`;
}
