import { strict as assert } from "node:assert";
import { test } from "node:test";

import { OutputFollower, type OutputPage } from "../../src/client/output";
import { RepoStore, lastLine } from "../../src/client/store";
import { emptyState, type RepoState, type Task } from "../../src/client/types";

const task = (id: string, status: string, extra: Partial<Task> = {}): Task => ({ id, title: id, status, dependsOn: [], attempts: 0, ...extra });

function snapshot(lastEventId: number, tasks: Task[] = []): RepoState {
  return { ...emptyState(), tasks, daemon: { lastEventId } };
}

test("a snapshot replaces everything; tasks.changed merges partial tasks by id", () => {
  const s = new RepoStore();
  s.apply({ id: 5, type: "state.snapshot", data: snapshot(5, [task("a", "ready"), task("b", "pending")]) as never });
  s.apply({ id: 6, type: "tasks.changed", data: { tasks: [{ id: "a", status: "working" }], partial: true } });
  assert.equal(s.task("a")?.status, "working");
  assert.equal(s.task("a")?.title, "a", "fields the event left out are kept");
  assert.equal(s.task("b")?.status, "pending");
  assert.equal(s.state.stats["working"], 1);
  assert.equal(s.state.stats["ready"], 0, "a status no task has any more counts 0");
  assert.equal(s.appliedId, 6);
});

test("an older /state answer never rolls back newer events", () => {
  const s = new RepoStore();
  s.accept(snapshot(3));
  s.apply({ id: 9, type: "tasks.changed", data: { tasks: [task("x", "ready")] } });
  assert.equal(s.accept(snapshot(8)), false);
  assert.equal(s.task("x")?.status, "ready");
  assert.equal(s.accept(snapshot(9, [task("x", "working")])), true);
  assert.equal(s.task("x")?.status, "working");
});

test("agents come and go; output updates the last line; questions add and disappear when answered elsewhere", () => {
  const s = new RepoStore();
  s.accept(snapshot(0));
  s.apply({ id: 1, type: "agent.spawned", data: { agentId: "ex-1", taskId: "a", worktree: "/w" } });
  s.apply({ id: 2, type: "agent.output", data: { agentId: "ex-1", chunk: "one\ntwo\n\n", seq: 3 } });
  assert.equal(s.agent("ex-1")?.lastOutput, "two");
  assert.equal(s.agent("ex-1")?.outputSeq, 3);
  s.apply({ id: 3, type: "agent.question", data: { questionId: "q-1", agentId: "ex-1", taskId: "a", question: "Color?", options: ["red"] } });
  assert.equal(s.state.pendingQuestions.length, 1);
  assert.equal(s.agent("ex-1")?.status, "waiting");
  s.apply({ id: 4, type: "question.answered", data: { questionId: "q-1", agentId: "ex-1" } });
  assert.equal(s.state.pendingQuestions.length, 0);
  assert.equal(s.agent("ex-1")?.status, "running");
  s.apply({ id: 5, type: "agent.completed", data: { agentId: "ex-1", taskId: "a" } });
  assert.equal(s.state.agents.length, 0);
});

test("session events start and stop the session with its reason", () => {
  const s = new RepoStore();
  s.apply({ id: 1, type: "session.started", data: { featureBranch: "feat", maxAgents: 2, budgetUsd: null } });
  assert.deepEqual([s.state.session.started, s.state.session.featureBranch, s.state.session.maxAgents], [true, "feat", 2]);
  s.apply({ id: 2, type: "session.stopped", data: { reason: "no_work" } });
  assert.deepEqual([s.state.session.started, s.state.session.stopReason], [false, "no_work"]);
});

test("lastLine skips trailing blank lines", () => {
  assert.equal(lastLine("a\r\nb\r\n   \n"), "b");
  assert.equal(lastLine("\n\n"), undefined);
});

test("output: live chunks in order are written once; a gap is filled from output?since=", async () => {
  const log: Record<number, string> = { 1: "a", 2: "b", 3: "c", 4: "d", 5: "e" };
  const asked: number[] = [];
  const fetchPage = async (since: number): Promise<OutputPage> => {
    asked.push(since);
    const chunks = Object.entries(log)
      .map(([k, v]) => ({ seq: Number(k), chunk: v }))
      .filter((c) => c.seq > since)
      .slice(0, 2);
    return { seq: 5, chunks, more: chunks.length > 0 && (chunks.at(-1)?.seq ?? 5) < 5 };
  };
  let out = "";
  const f = new OutputFollower(fetchPage, (t) => (out += t));
  await f.offer({ seq: 1, chunk: "a" });
  await f.offer({ seq: 1, chunk: "a" });
  await f.offer({ seq: 4, chunk: "d" }); // 2 and 3 were missed (a reconnect)
  await f.offer({ seq: 5, chunk: "e" });
  assert.equal(out, "abcde");
  assert.equal(f.shown, 5);
  assert.deepEqual(asked.slice(0, 2), [1, 3]);
});

test("what a run's sandbox refused is counted on its agent, with the last target", () => {
  const s = new RepoStore();
  s.accept(snapshot(0));
  s.apply({ id: 1, type: "agent.spawned", data: { agentId: "box-1", taskId: "a", worktree: "/w" } });
  assert.equal(s.apply({ id: 2, type: "agent.sandbox_denied", data: { agentId: "box-1", taskId: "a", kind: "network", target: "evil.test:443", unreported: 0 } }), true);
  assert.equal(s.agent("box-1")?.sandboxDenied, 1);
  s.apply({ id: 3, type: "agent.sandbox_denied", data: { agentId: "box-1", taskId: "a", kind: "network", target: "other.test:80", unreported: 4 } });
  assert.equal(s.agent("box-1")?.sandboxDenied, 6, "the refusals held back count too");
  assert.equal(s.agent("box-1")?.lastDenied, "other.test:80");
  assert.equal(s.apply({ id: 4, type: "agent.sandbox_denied", data: { agentId: "gone-1", target: "x:1" } }), false);
});
