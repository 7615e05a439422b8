import { strict as assert } from "node:assert";
import { test } from "node:test";

import { Backoff } from "../../src/client/backoff";

test("delays grow exponentially up to the cap and restart after reset", () => {
  const b = new Backoff({ initialMs: 100, maxMs: 1000, factor: 2, jitter: 0 });
  assert.deepEqual([1, 2, 3, 4, 5, 6].map(() => b.next()), [100, 200, 400, 800, 1000, 1000]);
  assert.equal(b.attempts, 6);
  b.reset();
  assert.equal(b.next(), 100);
});

test("jitter only ever shortens a delay, by at most its fraction", () => {
  const low = new Backoff({ initialMs: 1000, maxMs: 1000, factor: 2, jitter: 0.5 }, () => 1);
  const high = new Backoff({ initialMs: 1000, maxMs: 1000, factor: 2, jitter: 0.5 }, () => 0);
  assert.equal(low.next(), 500);
  assert.equal(high.next(), 1000);
});
