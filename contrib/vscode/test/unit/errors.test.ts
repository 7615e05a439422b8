import { strict as assert } from "node:assert";
import { test } from "node:test";

import { GriddError, TransportError, explain, parseErrorBody } from "../../src/client/errors";
import { checkVersion } from "../../src/client/version";

test("gridd's error body becomes code, message and details", () => {
  const e = parseErrorBody(404, '{"error":{"code":"task_not_found","message":"no task \'zz\'","details":{"id":"zz"}}}');
  assert.equal(e.status, 404);
  assert.equal(e.code, "task_not_found");
  assert.equal(e.message, "no task 'zz'");
  assert.deepEqual(e.details, { id: "zz" });
});

test("a body that is not gridd's error shape still gives a readable error", () => {
  const e = parseErrorBody(502, "<html>bad gateway</html>");
  assert.equal(e.code, "http_502");
  assert.match(e.message, /502.*bad gateway/);
});

test("a stale view's conflict offers a refresh, not a retry", () => {
  const x = explain(new GriddError(409, "task_not_in_review", "task 'a' is working, not in review"));
  assert.equal(x.message, "task 'a' is working, not in review");
  assert.equal(x.action?.command, "gridd.refresh");
});

test("validation problems are listed field by field", () => {
  const x = explain(
    new GriddError(422, "validation_failed", "invalid task", { problems: [{ field: "title", problem: "required" }] }),
  );
  assert.equal(x.message, "invalid task (title: required)");
  assert.equal(x.severity, "error");
});

test("a session on another branch offers to stop it", () => {
  assert.equal(explain(new GriddError(409, "session_running", "busy")).action?.command, "gridd.stopSession");
});

test("no daemon on the socket offers to start one; other socket errors offer a refresh", () => {
  assert.equal(explain(new TransportError("connect ENOENT", "ENOENT")).action?.command, "gridd.startDaemon");
  assert.equal(explain(new TransportError("refused", "ECONNREFUSED")).action?.command, "gridd.startDaemon");
  assert.equal(explain(new TransportError("reset", "ECONNRESET")).action?.command, "gridd.refresh");
});

test("server faults point at the daemon's log; unknown codes keep gridd's message", () => {
  assert.equal(explain(new GriddError(500, "internal_error", "boom")).action?.command, "gridd.showLog");
  const x = explain(new GriddError(409, "something_new", "new thing"));
  assert.equal(x.message, "new thing");
  assert.equal(x.action, undefined);
});

test("an unknown route says the daemon may be older than the extension", () => {
  assert.match(explain(new GriddError(404, "not_found", "no route")).message, /older than the extension/);
});

test("version skew: same apiVersion is fine, older daemon or older extension are named", () => {
  assert.equal(checkVersion({ version: "0.1.0", apiVersion: 1 }).ok, true);
  const older = checkVersion({ version: "0.0.9", apiVersion: 0 });
  assert.equal(older.ok, false);
  assert.match(older.message, /Upgrade gridd/);
  const newer = checkVersion({ version: "2.0.0", apiVersion: 2 });
  assert.match(newer.message, /Upgrade the gridd extension/);
  assert.equal(checkVersion({}).ok, false);
});

test("a refused approve for uncommitted review edits names the files and what to do", () => {
  const x = explain(new GriddError(409, "worktree_dirty", "task 'a' has uncommitted changes", { files: ["src/a.py", "b.txt"] }));
  assert.match(x.message, /\(src\/a\.py, b\.txt\)/);
  assert.match(x.message, /commit or discard them/);
});
