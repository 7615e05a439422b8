/**
 * The merge train as the editor shows it: which tasks ride in which candidate, and where
 * each candidate's gate is. Kept from `RepoState.mergeTrain` (in every snapshot) and the
 * `merge.batch_*` events between snapshots; pure, so it is tested without VS Code.
 */

import type { GriddEvent, RepoState, Task, TrainCandidate } from "./types";

/** The candidates a snapshot's `mergeTrain` names (none when no train runs). */
export function trainFromSnapshot(state: Pick<RepoState, "mergeTrain">): TrainCandidate[] {
  const train = state.mergeTrain;
  if (!train) return [];
  if (Array.isArray(train.candidates) && train.candidates.length > 0) {
    return train.candidates.map((c) => ({ ...c, bisecting: c.bisecting ?? train.bisecting }));
  }
  // A train of one candidate (gate_concurrency 1) may name only its own tasks and phase.
  const tasks = Array.isArray(train.tasks) ? train.tasks : [];
  return tasks.length ? [{ position: 1, tasks, phase: train.phase, bisecting: train.bisecting }] : [];
}

/** `candidates` after one `merge.batch_*` event; the same array when the event is not one. */
export function applyTrainEvent(candidates: TrainCandidate[], event: GriddEvent): TrainCandidate[] {
  const d = event.data;
  const position = typeof d["position"] === "number" ? d["position"] : undefined;
  const tasks = Array.isArray(d["tasks"]) ? (d["tasks"] as string[]) : [];
  const same = (c: TrainCandidate): boolean =>
    typeof d["candidate"] === "string" && c.candidate !== undefined ? c.candidate === d["candidate"] : sameTasks(c.tasks, tasks);
  switch (event.type) {
    case "merge.batch_started": {
      const at = position ?? 1;
      // Candidates are started in order: one at this position begins a new chain from here.
      const kept = candidates.filter((c) => c.position < at);
      const started: TrainCandidate = {
        position: at,
        tasks,
        candidate: typeof d["candidate"] === "string" ? d["candidate"] : undefined,
        phase: "gating",
        bisecting: d["bisecting"] === true,
        retry: d["retry"] === true,
      };
      return [...kept, started];
    }
    case "merge.batch_passed":
      return candidates.map((c) => (same(c) ? { ...c, phase: "landing" } : c));
    case "merge.batch_failed":
      return candidates.map((c) => (same(c) ? { ...c, phase: "failed" } : c));
    case "merge.batch_discarded":
      return candidates.filter((c) => !same(c));
    default:
      return candidates;
  }
}

/** One row per candidate still carrying a merging task, in order. */
export interface TrainRow {
  label: string;
  description: string;
  tooltip: string;
  icon: string;
}

export function trainRows(candidates: readonly TrainCandidate[], tasks: readonly Task[]): TrainRow[] {
  const merging = new Set(tasks.filter((t) => t.status === "merging").map((t) => t.id));
  return [...candidates]
    .filter((c) => c.tasks.some((id) => merging.has(id)))
    .sort((a, b) => a.position - b.position)
    .map((c) => {
      const [state, icon] = phaseText(c);
      const why = c.retry ? " · gated alone again" : c.bisecting ? " · finding the task that fails" : "";
      const on = c.position === 1 ? "on the feature branch" : `on candidate ${c.position - 1}`;
      return {
        label: `merge train: candidate ${c.position}`,
        description: `${c.tasks.join(", ")} · ${state}${why}`,
        tooltip: `${c.tasks.length === 1 ? "task" : "tasks"} ${c.tasks.join(", ")}, merged ${on}: ${state}${why}`,
        icon,
      };
    });
}

function phaseText(c: TrainCandidate): [string, string] {
  switch (c.phase) {
    case "landing":
    case "passed":
      return ["gate passed, landing", "check"];
    case "landed":
      return ["landed", "check"];
    case "failed":
      return ["gate failed", "error"];
    case "merging":
      return ["being merged", "git-merge"];
    default:
      return ["gate running", "sync~spin"];
  }
}

function sameTasks(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((id, i) => id === b[i]);
}
