/**
 * The wire shapes gridd sends (docs/api.md "The data"), as far as the extension reads them.
 * Unknown keys are allowed everywhere: gridd may add fields without an API version bump.
 */

export type TaskStatus =
  | "pending" | "ready" | "working" | "review" | "merging" | "done"
  | "failed" | "blocked" | "cancelled" | "rate_limited";

export interface Task {
  id: string;
  title: string;
  prompt?: string;
  status: TaskStatus | string;
  dependsOn: string[];
  attempts: number;
  maxAttempts?: number;
  sessions?: number;
  branch?: string | null;
  worktree?: string | null;
  error?: string | null;
  costUsd?: number;
  resumeAt?: string | null;
  waitingSince?: string | null;
  changedFiles?: string[];
  mergeConflict?: string[];
  /** Files git still saw a conflict in, or that the merge refused for conflict markers. */
  conflictUnresolved?: string[];
  /** A cancelled task's completed work, kept on this branch. */
  keptBranch?: string | null;
  baseCommit?: string | null;
  updatedAt?: string;
  [key: string]: unknown;
}

export interface Agent {
  id: string;
  taskId: string;
  status: string;
  activity?: string | null;
  message?: string | null;
  lastOutput?: string | null;
  outputSeq?: number;
  costUsd?: number;
  stalled?: boolean;
  /** Refusals by its sandbox seen live (`agent.sandbox_denied`), and the last target. */
  sandboxDenied?: number;
  lastDenied?: string;
  worktreePath?: string | null;
  [key: string]: unknown;
}

export interface Question {
  id: string;
  agentId: string;
  taskId: string;
  type?: string;
  question: string;
  options: string[];
  status?: string;
  [key: string]: unknown;
}

export interface SessionState {
  started: boolean;
  featureBranch: string | null;
  maxAgents: number;
  budgetUsd?: number | null;
  spentUsd?: number;
  stopReason?: string | null;
  [key: string]: unknown;
}

/** One candidate of the merge train (`RepoState.mergeTrain.candidates`, `merge.batch_*`). */
export interface TrainCandidate {
  position: number;
  tasks: string[];
  candidate?: string;
  /** "merging", "gating", "landing" (passed), "failed" (the daemon's, or from an event). */
  phase?: string;
  bisecting?: boolean;
  retry?: boolean;
  [key: string]: unknown;
}

/** The merge train under way (`GET /state`'s `mergeTrain`; null when none runs). */
export interface MergeTrain {
  batchId?: string;
  phase?: string;
  tasks?: string[];
  bisecting?: boolean;
  candidates?: TrainCandidate[];
  [key: string]: unknown;
}

export interface RepoState {
  session: SessionState;
  tasks: Task[];
  agents: Agent[];
  pendingQuestions: Question[];
  stats: Record<string, number>;
  conflicts?: Conflict[];
  mergeTrain?: MergeTrain | null;
  /** `reviewEdits`: the daemon's `[merge] review_edits` (absent from an older gridd). */
  daemon: { version?: string; apiVersion?: number; lastEventId?: number; workspace?: string; reviewEdits?: string; [key: string]: unknown };
  [key: string]: unknown;
}

/** One finding of gridd's conflict radar (`GET /conflicts`, `RepoState.conflicts`). */
export interface Conflict {
  id?: string;
  /** "tasks": two live tasks change the same files; "feature": a task and what landed. */
  kind?: string;
  tasks?: string[];
  files: string[];
  predictedConflict?: boolean;
  conflictFiles?: string[];
  [key: string]: unknown;
}

/** One event as the stream delivered it: its id, type and parsed data. */
export interface GriddEvent {
  readonly id: number;
  readonly type: string;
  readonly data: Record<string, unknown>;
}

export function emptyState(): RepoState {
  return {
    session: { started: false, featureBranch: null, maxAgents: 0, spentUsd: 0, stopReason: null },
    tasks: [],
    agents: [],
    pendingQuestions: [],
    stats: {},
    daemon: {},
  };
}
