import { strict as assert } from "node:assert";
import { test } from "node:test";

import {
  agentsRow,
  answerChoices,
  cancelImpact,
  conflictFiles,
  conflictMark,
  linkBanner,
  newlyInReview,
  proposeBranch,
  reviewEditsMode,
  reviewEditsNote,
  settledMessage,
  stopReasonText,
  taskName,
  unsavedEditsNote,
  stopSessionImpact,
  type LinkFacts,
} from "../../src/client/review";
import { RepoStore } from "../../src/client/store";
import { emptyState, type RepoState, type Task } from "../../src/client/types";

const task = (id: string, status: string, extra: Partial<Task> = {}): Task => ({ id, title: id, status, dependsOn: [], attempts: 0, ...extra });

test("a question with options still takes typed text, offered first, the options after it", () => {
  assert.deepEqual(answerChoices(["red", "blue"], ""), ["red", "blue"]);
  assert.deepEqual(answerChoices(["red", "blue"], "  teal, please "), ["teal, please", "red", "blue"]);
  assert.deepEqual(answerChoices(["red", "blue"], "blue"), ["red", "blue"]);
});

test("a stale question toast says whether it was answered or closed, with the daemon's reason", () => {
  const store = new RepoStore();
  const q = (id: string, agentId: string) => ({ id: 1, type: "agent.question", data: { questionId: id, agentId, taskId: "t", question: "colour?", options: ["red"] } });
  store.apply({ id: 0, type: "agent.spawned", data: { agentId: "a1", taskId: "t" } });
  store.apply({ id: 0, type: "agent.spawned", data: { agentId: "a3", taskId: "u" } });
  store.apply(q("q1", "a1"));
  store.apply(q("q2", "a2"));
  store.apply(q("q3", "a3"));
  store.apply({ id: 2, type: "question.answered", data: { questionId: "q1", agentId: "a1" } });
  store.apply({ id: 3, type: "question.closed", data: { questionId: "q2", agentId: "a2", reason: "the agent was stopped: session stopped" } });
  store.apply({ id: 4, type: "agent.stopped", data: { agentId: "a3" } });
  const ask = { question: "colour?", taskId: "t" };
  assert.match(settledMessage(ask, store.settled.get("q1")), /already answered elsewhere/);
  assert.equal(settledMessage(ask, store.settled.get("q2")), "“colour?” (t) is no longer asked: the agent was stopped: session stopped.");
  assert.match(settledMessage(ask, store.settled.get("q3")), /no longer asked: its agent ended/);
  assert.doesNotMatch(settledMessage(ask, store.settled.get("q2")), /answered/);
});

test("messages name a task by its title and id, and a session's stop reason in words, never internal codes", () => {
  const state = { ...emptyState(), tasks: [task("login", "working", { title: "Add login" }), task("bare", "working")] };
  assert.equal(taskName(state, "login"), "Add login (login)");
  assert.equal(taskName(state, "bare"), "bare"); // its title is its id
  assert.equal(taskName(state, "gone"), "gone");
  assert.equal(stopReasonText("no_work"), "every task settled");
  assert.equal(stopReasonText("budget_exhausted"), "its budget ran out");
  assert.equal(stopReasonText("user"), "stopped by hand");
  assert.equal(stopReasonText("some_new_reason"), "some new reason");
});

test("a task is marked for unresolved markers and for a conflict that came back, each file once", () => {
  assert.deepEqual(conflictFiles(task("a", "review")), []);
  assert.deepEqual(conflictFiles(task("a", "review", { conflictUnresolved: ["x.py", "y.py"], mergeConflict: ["y.py"] })), ["x.py", "y.py"]);
});

test("a merge conflict that came back from its agent is marked as resolved by it, not as unresolved", () => {
  const feedback = "Merging this task into the feature branch 'feat' conflicted. The feature branch has been merged into your worktree.";
  const back = conflictMark(task("y", "review", { mergeConflict: ["shared.txt"], feedback }));
  assert.equal(back?.cameBack, true);
  assert.equal(back?.description, "was a merge conflict in shared.txt, resolved by its agent: check it");
  assert.equal(back?.message, feedback);
  assert.deepEqual(back?.unresolved, []);
  assert.match(conflictMark(task("y", "working", { mergeConflict: ["shared.txt"] }))?.description ?? "", /back with its agent/);
  assert.match(conflictMark(task("y", "review", { mergeConflict: ["shared.txt"] }), true)?.description ?? "", /gridd asks what to do/);
  const markers = conflictMark(task("y", "review", { mergeConflict: ["shared.txt"], conflictUnresolved: ["notes.txt"] }));
  assert.equal(markers?.description, "unresolved conflict in notes.txt");
  assert.deepEqual(markers?.files, ["notes.txt", "shared.txt"]);
  assert.equal(conflictMark(task("y", "review")), undefined);
  assert.equal(conflictMark(task("y", "done", { mergeConflict: ["shared.txt"] })), undefined); // merged in the end
});

test("review_edits is what the daemon reports in its state, never a guess from a file", () => {
  const state = (reviewEdits?: string): RepoState => ({ ...emptyState(), daemon: reviewEdits === undefined ? {} : { reviewEdits } });
  assert.equal(reviewEditsMode(state("refuse")), "refuse");
  assert.equal(reviewEditsMode(state("commit")), "commit");
  assert.equal(reviewEditsMode(state()), undefined); // an older gridd does not say
  assert.equal(reviewEditsMode(state("something-new")), undefined);
  assert.match(reviewEditsNote("commit"), /committed on its branch as a review commit/);
  assert.match(reviewEditsNote("refuse"), /stop the approve/);
  assert.match(reviewEditsNote(undefined), /does not report it/);
  assert.match(unsavedEditsNote("commit"), /^Saved, they are committed on its branch as a review commit.*Not saved, they are not part of what is approved/);
  assert.match(unsavedEditsNote("refuse"), /^Saved, they stop the approve until you commit or discard them/);
});

test("a review notification is due only for tasks that newly reached review after the first load", () => {
  const tasks = [task("a", "review"), task("b", "review"), task("c", "working")];
  assert.deepEqual(newlyInReview(undefined, tasks), []);
  const before = new Map([["a", "review"], ["b", "working"]]);
  assert.deepEqual(newlyInReview(before, tasks).map((t) => t.id), ["b"]);
});

test("Start Session proposes a branch that does not exist yet", () => {
  const now = new Date("2026-11-26T08:00:00Z");
  assert.equal(proposeBranch(["main"], now), "feature/session-2026-11-26");
  assert.equal(proposeBranch(["main", "feature/session-2026-11-26"], now), "feature/session-2026-11-26-2");
});

test("Stop Session and Cancel Task say how many agents and questions they affect", () => {
  const s: RepoState = {
    ...emptyState(),
    tasks: [task("a", "working"), task("b", "pending", { dependsOn: ["a"] })],
    agents: [
      { id: "a1", taskId: "a", status: "waiting" },
      { id: "a2", taskId: "z", status: "running" },
    ],
    pendingQuestions: [{ id: "q1", agentId: "a1", taskId: "a", question: "?", options: [] }],
  };
  assert.equal(stopSessionImpact(s), "This stops 2 running agents and 1 question waiting for an answer.");
  assert.equal(stopSessionImpact(emptyState()), "No agent is running.");
  assert.equal(cancelImpact(s, "a"), "This stops 1 running agent, drops 1 waiting question, leaves 1 dependent task waiting on it.");
  assert.equal(cancelImpact(s, "b"), "No agent is working on it.");
});

test("each link state has its own banner; a clean stop is not 'connecting'", () => {
  const base: LinkFacts = { gitRepo: true, connected: false, everConnected: false, socketExists: false, stoppedOnPurpose: false, versionOk: true };
  assert.equal(linkBanner({ ...base, gitRepo: false }), "no-repo");
  assert.equal(linkBanner(base), "not-running");
  assert.equal(linkBanner({ ...base, socketExists: true }), "connecting");
  assert.equal(linkBanner({ ...base, everConnected: true, socketExists: true }), "connecting");
  assert.equal(linkBanner({ ...base, everConnected: true, socketExists: true, stoppedOnPurpose: true }), "stopped");
  assert.equal(linkBanner({ ...base, everConnected: true }), "stopped");
  assert.equal(linkBanner({ ...base, connected: true }), "connected");
  assert.equal(linkBanner({ ...base, connected: true, versionOk: false }), "version-mismatch");
});

test("the agents row counts what the daemon counts, and says when hand-started agents exceed the limit", () => {
  assert.equal(agentsRow(2, 3, true), "2 of 3");
  assert.equal(agentsRow(4, 3, true), "4 running: 1 over the session's limit of 3 (started by hand); no new one starts until below it");
  assert.equal(agentsRow(1, 3, false), "1 running (no session: started by hand)");
  assert.equal(agentsRow(0, 3, false), "none running");
});
