// @ts-check
/**
 * The in-extension-host test: code-server loads the extension as a development extension
 * and runs suite/index.js inside its Node extension host (like @vscode/test-electron's
 * extensionTestsPath), with the real vscode API, against a real gridd. The suite asks this
 * process to kill and restart gridd through a small control server on 127.0.0.1.
 */
"use strict";

const fs = require("node:fs");
const http = require("node:http");
const path = require("node:path");

const { agent, api, CodeServer, EXT, Gridd, launchBrowser, makeRepo, Runner, writeConfig } = require("./lib");

/** @param {string} out */
async function runInHost(out) {
  const repo = makeRepo();
  const stateHome = path.join(repo, ".e2e-state");
  const ctrlDir = path.join(repo, ".e2e-ctrl");
  fs.mkdirSync(stateHome);
  fs.mkdirSync(ctrlDir);
  fs.writeFileSync(path.join(repo, ".git", "info", "exclude"), ".e2e-state/\n.e2e-ctrl/\n.gridd-e2e.log\n");
  writeConfig(
    repo,
    {
      ticker: { command: agent("ticker.py", ctrlDir, "0.05") },
      reader: { command: agent("read_line.py") },
      asker: { command: agent("ask_heartbeat.py", "Proceed?", "yes", "no") },
    },
    { max_agents: 4 },
    stateHome,
  );
  const gridd = new Gridd(repo, { XDG_STATE_HOME: stateHome, GRID_EXAMPLE_DELAY: "0.1" });
  await gridd.start();
  await api(gridd.sock, "POST", "/tasks", [
    { id: "tick", title: "Print ticks", agent: "ticker" },
    { id: "read", title: "Read a follow-up", agent: "reader" },
    { id: "ask2", title: "Ask to proceed", agent: "asker" },
    { id: "ex", title: "Write notes", agent: "example" },
  ]);
  // The control server: the suite (in the extension host) asks for daemon kills and restarts.
  const control = http.createServer((req, res) => {
    const done = (code, body) => {
      res.writeHead(code, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    const action = req.url === "/kill" ? gridd.kill() : req.url === "/start" ? gridd.start() : Promise.reject(new Error(`unknown ${req.url}`));
    action.then(() => done(200, { ok: true }), (e) => done(500, { error: String(e) }));
  });
  await new Promise((r) => control.listen(0, "127.0.0.1", () => r(undefined)));
  const controlPort = /** @type {import("node:net").AddressInfo} */ (control.address()).port;

  const cs = new CodeServer({
    ws: repo,
    linkExtension: false,
    env: { GRIDD_E2E_CONTROL: `http://127.0.0.1:${controlPort}`, GRIDD_E2E_CTRL_DIR: ctrlDir, XDG_STATE_HOME: stateHome },
  });
  await cs.start();
  const browser = await launchBrowser(out);
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const run = new Runner(out, undefined);
  const lines = [];
  let exitCode;
  try {
    const finished = new Promise((resolve) => {
      page.exposeFunction("codeAutomationExit", (code) => {
        exitCode = code;
        resolve(code);
      });
    });
    await page.exposeFunction("codeAutomationLog", (type, args) => {
      const text = (Array.isArray(args) ? args : [args]).map((a) => (typeof a === "string" ? a : JSON.stringify(a))).join(" ");
      lines.push(text);
      if (/^(PASS|FAIL|SKIP) /.test(text)) console.log(text);
    });
    const remote = (p) => `vscode-remote://127.0.0.1:${cs.port}${p}`;
    const payload = JSON.stringify([
      ["extensionDevelopmentPath", remote(EXT)],
      ["extensionTestsPath", remote(path.join(__dirname, "suite", "index.js"))],
    ]);
    await page.goto(cs.url(`&payload=${encodeURIComponent(payload)}`));
    const timeout = new Promise((resolve) => setTimeout(() => resolve("timeout"), 180000));
    const result = await Promise.race([finished, timeout]);
    await page.screenshot({ path: path.join(out, "inhost-final.png") }).catch(() => undefined);
    for (const text of lines) {
      if (text.startsWith("PASS ")) run.passed++;
      else if (text.startsWith("FAIL ")) run.failed++;
      else if (text.startsWith("SKIP ")) run.skipped.push(text.slice(5));
    }
    if (result === "timeout") {
      run.failed++;
      console.log("FAIL the in-host suite did not finish within 180 s");
    } else if (exitCode !== 0 && run.failed === 0) {
      run.failed++;
      console.log(`FAIL the suite exited ${exitCode}`);
    }
    fs.writeFileSync(path.join(out, "extension-host.log"), lines.join("\n") + "\n");
  } finally {
    console.log(run.summary() ? "inhost: ok" : "inhost: FAILED");
    await browser.close().catch(() => undefined);
    await Promise.all([cs.stop(), gridd.stop()]);
    control.close();
    if (run.failed === 0) fs.rmSync(repo, { recursive: true, force: true });
    else console.log(`kept ${repo} for inspection`);
  }
  return run;
}

module.exports = { runInHost };
