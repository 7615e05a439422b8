// @ts-check
/**
 * Entry point of the extension's end-to-end tests: `node run.js ui|inhost|all`.
 * Screenshots and logs go to $GRIDD_E2E_OUT (default ../test-output/<suite>).
 * Prints "N passed, M failed, K skipped" and exits non-zero on any failure.
 */
"use strict";

const fs = require("node:fs");
const path = require("node:path");

async function main() {
  const which = process.argv[2] || "all";
  let ok = true;
  for (const suite of which === "all" ? ["ui", "inhost"] : [which]) {
    const out = which === "all" || !process.env.GRIDD_E2E_OUT ? path.resolve(__dirname, "..", "test-output", suite) : process.env.GRIDD_E2E_OUT;
    fs.rmSync(out, { recursive: true, force: true });
    fs.mkdirSync(out, { recursive: true });
    const started = Date.now();
    const run = suite === "ui" ? await require("./ui").runUi(out) : await require("./inhost").runInHost(out);
    console.log(`${suite}: ${run.passed} passed, ${run.failed} failed, ${run.skipped.length} skipped in ${((Date.now() - started) / 1000).toFixed(1)} s`);
    ok = ok && run.failed === 0;
  }
  process.exit(ok ? 0 : 1);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
