/**
 * The extension's copy of the daemon's RepoState, kept current from events.
 *
 * A snapshot replaces everything; other events patch what they name (tasks.changed merges
 * by id, agent and question events add, update or drop entries). Fields no event carries
 * (costs, activity) come with the next snapshot or `GET /state`, which `accepts` only when
 * it is at least as new as what was already applied, so a slow answer never rolls back.
 */

import type { Settled } from "./review";
import { applyTrainEvent, trainFromSnapshot } from "./train";
import type { Agent, GriddEvent, Question, RepoState, Task, TrainCandidate } from "./types";
import { emptyState } from "./types";

const AGENT_GONE = new Set(["agent.completed", "agent.failed", "agent.stopped", "agent.launch_failed"]);

export class RepoStore {
  state: RepoState = emptyState();
  /** The id of the newest event reflected in `state`; -1 before the first snapshot. */
  appliedId = -1;
  /** True once a snapshot (from the stream or /state) has been applied. */
  loaded = false;
  /** How questions stopped being pending (answered, or closed and why), by question id. */
  readonly settled = new Map<string, Settled>();
  /** The merge train's candidates: from the last snapshot, then its `merge.batch_*` events. */
  train: TrainCandidate[] = [];

  /** Replace everything with a full RepoState if it is not older than what we hold. */
  accept(state: RepoState): boolean {
    const id = typeof state.daemon?.lastEventId === "number" ? state.daemon.lastEventId : -1;
    if (this.loaded && id < this.appliedId) return false;
    this.replace(state, id);
    return true;
  }

  /** Forget everything (after a `reset`: ids may have started again). */
  clear(): void {
    this.state = emptyState();
    this.appliedId = -1;
    this.loaded = false;
    this.train = [];
  }

  /** Apply one event; returns whether anything visible changed. */
  apply(event: GriddEvent): boolean {
    const d = event.data;
    if (event.type === "state.snapshot") {
      this.replace(d as unknown as RepoState, event.id);
      return true;
    }
    if (event.type === "reset") return false;
    if (Number.isFinite(event.id)) this.appliedId = Math.max(this.appliedId, event.id);
    const s = this.state;
    if (event.type.startsWith("merge.batch_")) {
      const before = this.train;
      this.train = applyTrainEvent(before, event);
      return this.train !== before;
    }
    switch (event.type) {
      case "tasks.changed": {
        const tasks = Array.isArray(d["tasks"]) ? (d["tasks"] as Task[]) : [];
        if (d["partial"] === false) {
          s.tasks = [...tasks];
        } else {
          const byId = new Map(s.tasks.map((t) => [t.id, t] as const));
          for (const t of tasks) byId.set(t.id, { ...byId.get(t.id), ...t });
          s.tasks = [...byId.values()];
        }
        s.stats = withCounts(s.stats, s.tasks);
        return true;
      }
      case "session.started":
        s.session = {
          ...s.session,
          started: true,
          featureBranch: str(d["featureBranch"]) ?? s.session.featureBranch,
          maxAgents: typeof d["maxAgents"] === "number" ? d["maxAgents"] : s.session.maxAgents,
          budgetUsd: (d["budgetUsd"] as number | null | undefined) ?? null,
          stopReason: null,
        };
        return true;
      case "session.stopped":
        s.session = { ...s.session, started: false, stopReason: str(d["reason"]) ?? "user" };
        return true;
      case "agent.spawned": {
        const id = str(d["agentId"]);
        if (!id) return false;
        const agent: Agent = {
          ...this.agent(id),
          id,
          taskId: str(d["taskId"]) ?? "",
          status: "running",
          worktreePath: str(d["worktree"]) ?? null,
          profile: d["profile"],
          attempt: d["attempt"],
        };
        s.agents = [...s.agents.filter((a) => a.id !== id), agent];
        return true;
      }
      case "agent.output": {
        const agent = this.agent(str(d["agentId"]));
        if (!agent) return false;
        const line = lastLine(str(d["chunk"]) ?? "");
        if (line) agent.lastOutput = line;
        if (typeof d["seq"] === "number") agent.outputSeq = d["seq"];
        return true;
      }
      case "agent.question": {
        const q: Question = {
          id: str(d["questionId"]) ?? "",
          agentId: str(d["agentId"]) ?? "",
          taskId: str(d["taskId"]) ?? "",
          type: str(d["type"]),
          question: str(d["question"]) ?? "",
          options: Array.isArray(d["options"]) ? (d["options"] as string[]) : [],
          status: "pending",
        };
        if (!q.id) return false;
        s.pendingQuestions = [...s.pendingQuestions.filter((x) => x.id !== q.id), q];
        const agent = this.agent(q.agentId);
        if (agent) agent.status = "waiting";
        return true;
      }
      case "question.answered":
      case "question.closed": {
        const id = str(d["questionId"]);
        if (id) this.settled.set(id, event.type === "question.answered" ? { how: "answered" } : { how: "closed", reason: str(d["reason"]) });
        const before = s.pendingQuestions.length;
        s.pendingQuestions = s.pendingQuestions.filter((q) => q.id !== id);
        const agent = this.agent(str(d["agentId"]));
        if (agent && agent.status === "waiting" && !s.pendingQuestions.some((q) => q.agentId === agent.id)) {
          agent.status = "running";
        }
        return before !== s.pendingQuestions.length;
      }
      case "agent.sandbox_denied": {
        // What its sandbox refused it (rate-limited by the daemon: `unreported` more before).
        const agent = this.agent(str(d["agentId"]));
        if (!agent) return false;
        const unreported = typeof d["unreported"] === "number" ? d["unreported"] : 0;
        agent.sandboxDenied = (agent.sandboxDenied ?? 0) + 1 + unreported;
        agent.lastDenied = str(d["target"]);
        return true;
      }
      case "agent.stalled":
      case "agent.recovered": {
        const agent = this.agent(str(d["agentId"]));
        if (!agent) return false;
        agent.stalled = event.type === "agent.stalled";
        return true;
      }
      default:
        if (AGENT_GONE.has(event.type)) {
          const id = str(d["agentId"]);
          for (const q of s.pendingQuestions) {
            if (q.agentId === id && !this.settled.has(q.id)) this.settled.set(q.id, { how: "closed", reason: "its agent ended" });
          }
          s.agents = s.agents.filter((a) => a.id !== id);
          s.pendingQuestions = s.pendingQuestions.filter((q) => q.agentId !== id);
          return true;
        }
        return false;
    }
  }

  task(id: string): Task | undefined {
    return this.state.tasks.find((t) => t.id === id);
  }

  agent(id: string | undefined): Agent | undefined {
    return id === undefined ? undefined : this.state.agents.find((a) => a.id === id);
  }

  private replace(state: RepoState, id: number): void {
    this.state = {
      ...emptyState(),
      ...state,
      tasks: state.tasks ?? [],
      agents: state.agents ?? [],
      pendingQuestions: state.pendingQuestions ?? [],
    };
    this.train = trainFromSnapshot(this.state);
    if (Number.isFinite(id)) this.appliedId = id;
    this.loaded = true;
  }
}

/** The stats with every per-status counter recomputed from `tasks` (other keys kept). */
export function withCounts(stats: Record<string, number>, tasks: readonly Task[]): Record<string, number> {
  const out: Record<string, number> = { ...stats };
  for (const key of STAT_KEYS) out[key] = 0;
  return { ...out, ...countByStatus(tasks) };
}

const STAT_KEYS = ["pending", "ready", "working", "review", "merging", "done", "failed", "blocked", "cancelled", "rateLimited"];

export function countByStatus(tasks: readonly Task[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const t of tasks) {
    const key = t.status === "rate_limited" ? "rateLimited" : t.status;
    out[key] = (out[key] ?? 0) + 1;
  }
  return out;
}

export function lastLine(chunk: string): string | undefined {
  const lines = chunk.split(/\r?\n|\r/).map((l) => l.trim()).filter((l) => l !== "");
  return lines.length ? lines[lines.length - 1] : undefined;
}

function str(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}
