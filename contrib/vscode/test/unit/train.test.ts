import { strict as assert } from "node:assert";
import { test } from "node:test";

import { RepoStore } from "../../src/client/store";
import { trainRows } from "../../src/client/train";
import { emptyState, type RepoState, type Task } from "../../src/client/types";

const task = (id: string, status: string): Task => ({ id, title: id, status, dependsOn: [], attempts: 0 });

function snapshot(lastEventId: number, tasks: Task[], mergeTrain: RepoState["mergeTrain"] = null): RepoState {
  return { ...emptyState(), tasks, daemon: { lastEventId }, mergeTrain };
}

test("the merge train's candidates come from the snapshot and show which tasks ride where", () => {
  const s = new RepoStore();
  const tasks = ["a", "b", "c"].map((id) => task(id, "merging"));
  const train = {
    batchId: "b1",
    phase: "gating",
    tasks: ["a", "b", "c"],
    candidates: [
      { position: 2, tasks: ["c"], candidate: "c2", phase: "gating" },
      { position: 1, tasks: ["a", "b"], candidate: "c1", phase: "gating" },
    ],
  };
  s.apply({ id: 4, type: "state.snapshot", data: snapshot(4, tasks, train) as never });
  const rows = trainRows(s.train, s.state.tasks);
  assert.deepEqual(
    rows.map((r) => [r.label, r.description]),
    [
      ["merge train: candidate 1", "a, b · gate running"],
      ["merge train: candidate 2", "c · gate running"],
    ],
  );
  assert.match(rows[1]?.tooltip ?? "", /merged on candidate 1/);
});

test("merge.batch events move the train between snapshots: passed lands, a failure ahead discards those behind", () => {
  const s = new RepoStore();
  const tasks = ["a", "b", "c"].map((id) => task(id, "merging"));
  s.apply({ id: 1, type: "state.snapshot", data: snapshot(1, tasks) as never });
  assert.deepEqual(trainRows(s.train, s.state.tasks), [], "no train runs yet");
  const started = (id: number, position: number, ids: string[], extra: Record<string, unknown> = {}) =>
    s.apply({ id, type: "merge.batch_started", data: { batchId: `b${id}`, position, tasks: ids, candidate: `k${id}`, ...extra } });
  assert.equal(started(2, 1, ["a"]), true);
  started(3, 2, ["b"]);
  started(4, 3, ["c"]);
  s.apply({ id: 5, type: "merge.batch_failed", data: { batchId: "b3", tasks: ["b"], candidate: "k3" } });
  s.apply({ id: 6, type: "merge.batch_discarded", data: { batchId: "b4", tasks: ["c"], candidate: "k4", reason: "ahead_failed" } });
  s.apply({ id: 7, type: "merge.batch_passed", data: { batchId: "b2", tasks: ["a"], candidate: "k2" } });
  assert.deepEqual(
    trainRows(s.train, s.state.tasks).map((r) => r.description),
    ["a · gate passed, landing", "b · gate failed"],
  );
  // Bisection starts a new chain at position 1: what was behind goes.
  started(8, 1, ["b"], { bisecting: true });
  assert.deepEqual(
    trainRows(s.train, s.state.tasks).map((r) => r.description),
    ["b · gate running · finding the task that fails"],
  );
  // A task that left merging takes its candidate's row with it.
  s.apply({ id: 9, type: "tasks.changed", data: { tasks: [{ id: "b", status: "review" }], partial: true } });
  assert.deepEqual(trainRows(s.train, s.state.tasks), []);
});
