// @ts-check
/**
 * Shared machinery of the end-to-end tests: a throwaway git repo, a real gridd on it, a
 * real code-server with the extension, and a tiny runner that prints "N passed, M failed".
 * Facts behind the flags: ../../../../shared/EDITOR-TESTING.md (kept with the project).
 */
"use strict";

const { spawn, execFileSync } = require("node:child_process");
const fs = require("node:fs");
const http = require("node:http");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");

const PYTHON = process.env.GRIDD_PYTHON || "python3";
const REPO = process.env.GRIDD_REPO || path.resolve(__dirname, "../../..");
const EXT = path.resolve(__dirname, "..");
const AGENTS = path.join(REPO, "tests", "agents");

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

/** Poll `fn` until it returns a truthy value; the error names what was awaited. */
async function waitFor(fn, what, timeoutMs = 20000, everyMs = 100) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (last error: ${last})` : ""}`);
    await sleep(everyMs);
  }
}

function git(cwd, ...args) {
  return execFileSync("git", args, { cwd, encoding: "utf8", env: { ...process.env, GIT_CONFIG_NOSYSTEM: "1" } });
}

/** A git repo with one commit, under a short /tmp path (socket paths are limited to ~107 bytes). */
function makeRepo() {
  const root = fs.mkdtempSync("/tmp/gv");
  git(root, "init", "-q", "-b", "main");
  git(root, "config", "user.email", "test@example.com");
  git(root, "config", "user.name", "gridd e2e");
  fs.writeFileSync(path.join(root, "README.md"), "e2e repo\n");
  git(root, "add", "README.md");
  git(root, "commit", "-q", "-m", "init");
  return root;
}

function toml(v) {
  if (Array.isArray(v)) return `[${v.map(toml).join(", ")}]`;
  if (typeof v === "object" && v !== null) return `{ ${Object.entries(v).map(([k, x]) => `${k} = ${toml(x)}`).join(", ")} }`;
  return JSON.stringify(v);
}

/** `.grid/config.toml` with the given agent profiles; trusted for gridd when it asks for that. */
function writeConfig(root, profiles, scheduler = {}, stateHome) {
  const grid = path.join(root, ".grid");
  fs.mkdirSync(grid, { recursive: true, mode: 0o700 });
  let text = "[scheduler]\n" + Object.entries(scheduler).map(([k, v]) => `${k} = ${toml(v)}\n`).join("");
  for (const [name, p] of Object.entries(profiles)) {
    text += `\n[agents.${name}]\n` + Object.entries(p).map(([k, v]) => `${k} = ${toml(v)}\n`).join("");
  }
  fs.writeFileSync(path.join(grid, "config.toml"), text);
  // A repo config that names commands must be trusted (gridd/trust.py) when this gridd has trust.
  try {
    execFileSync(PYTHON, ["-m", "gridd.cli.gridctl", "trust", "--help"], { cwd: REPO, stdio: "pipe" });
  } catch {
    return; // this gridd has no trust yet: its config is used as it is
  }
  execFileSync(PYTHON, ["-m", "gridd.cli.gridctl", "--workspace", root, "trust"], { cwd: root, env: { ...process.env, XDG_STATE_HOME: stateHome }, stdio: "pipe" });
}

const agent = (script, ...args) => [PYTHON, path.join(AGENTS, script), ...args];

/** One HTTP call over the socket; resolves {status, body}. */
function call(sock, method, p, body) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request({ socketPath: sock, method, path: p, headers: payload ? { "content-type": "application/json" } : {} }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let parsed;
        try {
          parsed = text ? JSON.parse(text) : undefined;
        } catch {
          parsed = text;
        }
        resolve({ status: res.statusCode || 0, body: parsed });
      });
    });
    req.on("error", reject);
    req.setTimeout(15000, () => req.destroy(new Error(`${method} ${p} timed out`)));
    if (payload) req.write(payload);
    req.end();
  });
}

async function api(sock, method, p, body) {
  const r = await call(sock, method, p, body);
  if (r.status >= 300) throw new Error(`${method} ${p} -> ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

/** Ids of every event in the daemon's log after `since`, up to `until` (read from the SSE stream). */
function logIds(sock, since, until) {
  return new Promise((resolve, reject) => {
    const ids = [];
    const req = http.request({ socketPath: sock, method: "GET", path: `/events?since=${since}` }, (res) => {
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (t) => {
        buf += t;
        for (const m of buf.matchAll(/^id: (\d+)\r?$/gm)) {
          const id = Number(m[1]);
          if (!ids.includes(id)) ids.push(id);
        }
        buf = buf.slice(Math.max(0, buf.lastIndexOf("\n")));
        if (ids.length && ids[ids.length - 1] >= until) {
          req.destroy();
          resolve(ids.filter((i) => i <= until));
        }
      });
    });
    req.on("error", (e) => (ids.length ? resolve(ids) : reject(e)));
    req.setTimeout(10000, () => req.destroy(new Error("log read timed out")));
    req.end();
  });
}

class Gridd {
  constructor(root, env) {
    this.root = root;
    this.env = env;
    this.sock = path.join(root, ".grid", "gridd.sock");
    this.proc = undefined;
  }

  /** @param {{apiVersion?: number}} [o] apiVersion: the real gridd, made to speak another API version (a skewed daemon) */
  async start(o = {}) {
    const log = fs.openSync(path.join(this.root, ".gridd-e2e.log"), "a");
    const main = o.apiVersion === undefined
      ? ["-m", "gridd.cli.gridd_main"]
      : ["-c", `import sys, gridd.grid; gridd.grid.API_VERSION = ${Number(o.apiVersion)}; from gridd.cli.gridd_main import main; sys.exit(main())`];
    this.proc = spawn(PYTHON, [...main, "--workspace", this.root], { cwd: REPO, env: { ...process.env, ...this.env }, stdio: ["ignore", log, log] });
    fs.closeSync(log);
    const proc = this.proc;
    await waitFor(async () => {
      if (proc.exitCode !== null) throw new Error(`gridd exited ${proc.exitCode}: ${fs.readFileSync(path.join(this.root, ".gridd-e2e.log"), "utf8").slice(-2000)}`);
      return (await call(this.sock, "GET", "/health")).status === 200;
    }, "gridd to answer /health", 20000);
  }

  /** kill -9: the stream breaks without a goodbye, the socket file stays behind. */
  async kill() {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null) return;
    const gone = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGKILL");
    await gone;
  }

  async stop() {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null) return;
    await call(this.sock, "POST", "/session/stop?force=1").catch(() => undefined);
    const gone = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    await Promise.race([gone, sleep(8000)]);
    if (proc.exitCode === null) proc.kill("SIGKILL");
  }
}

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = /** @type {net.AddressInfo} */ (s.address()).port;
      s.close(() => resolve(port));
    });
  });
}

class CodeServer {
  /** @param {{ws: string, linkExtension: boolean, env?: Record<string,string>, settings?: object}} o */
  constructor(o) {
    this.o = o;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "gvcs"));
    this.port = 0;
    this.proc = undefined;
  }

  async start() {
    const d = this.dir;
    for (const sub of ["home", "data/User", "exts"]) fs.mkdirSync(path.join(d, sub), { recursive: true });
    const settings = {
      "workbench.startupEditor": "none",
      "security.workspace.trust.enabled": false,
      "telemetry.telemetryLevel": "off",
      "extensions.autoUpdate": false,
      "extensions.autoCheckUpdates": false,
      "workbench.tips.enabled": false,
      "git.enabled": false,
      ...this.o.settings,
    };
    fs.writeFileSync(path.join(d, "data/User/settings.json"), JSON.stringify(settings));
    if (this.o.linkExtension) {
      const pkg = JSON.parse(fs.readFileSync(path.join(EXT, "package.json"), "utf8"));
      fs.symlinkSync(EXT, path.join(d, "exts", `${pkg.publisher}.${pkg.name}-${pkg.version}`));
    }
    this.port = await freePort();
    const home = path.join(d, "home");
    this.proc = spawn(
      path.join(__dirname, "node_modules/.bin/code-server"),
      ["--auth", "none", "--bind-addr", `127.0.0.1:${this.port}`, "--user-data-dir", path.join(d, "data"), "--extensions-dir", path.join(d, "exts"),
        "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust", "--disable-getting-started-override", this.o.ws],
      {
        detached: true,
        stdio: ["ignore", fs.openSync(path.join(d, "code-server.log"), "a"), fs.openSync(path.join(d, "code-server.log"), "a")],
        env: { ...process.env, HOME: home, XDG_CONFIG_HOME: path.join(home, ".config"), XDG_DATA_HOME: path.join(home, ".local/share"), EXTENSIONS_GALLERY: "{}", ...this.o.env },
      },
    );
    await waitFor(() => new Promise((r) => http.get(`http://127.0.0.1:${this.port}/healthz`, (res) => { res.resume(); r(res.statusCode === 200); }).on("error", () => r(false))), "code-server /healthz", 30000, 200);
  }

  url(extra = "") {
    return `http://127.0.0.1:${this.port}/?folder=${encodeURIComponent(this.o.ws)}${extra}`;
  }

  async stop() {
    if (this.proc && this.proc.exitCode === null && this.proc.pid) {
      try {
        process.kill(-this.proc.pid, "SIGTERM");
      } catch {
        /* already gone */
      }
      await Promise.race([new Promise((r) => this.proc?.once("exit", r)), sleep(5000)]);
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

async function launchBrowser(out) {
  const { chromium } = require("playwright-core");
  return chromium.launch({
    executablePath: process.env.GRIDD_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    env: { ...process.env, XDG_CONFIG_HOME: path.join(out, "chromium-config"), HOME: path.join(out, "chromium-home") },
  });
}

/** Sequential scenarios: each may fail, skip (naming what is missing) or pass; later ones still run. */
class Runner {
  constructor(out, page) {
    this.out = out;
    this.page = page;
    this.passed = 0;
    this.failed = 0;
    this.skipped = [];
    this.n = 0;
  }

  async step(name, fn) {
    this.n++;
    const started = Date.now();
    try {
      const r = await fn();
      if (r && typeof r === "object" && "skip" in r) {
        this.skipped.push(`${name}: ${r.skip}`);
        console.log(`SKIP ${name}: ${r.skip}`);
      } else {
        this.passed++;
        console.log(`PASS ${name} (${Date.now() - started} ms)`);
      }
    } catch (e) {
      this.failed++;
      console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
    }
    if (this.page) {
      const file = path.join(this.out, `${String(this.n).padStart(2, "0")}-${name.replace(/[^a-z0-9]+/gi, "-").toLowerCase()}.png`);
      await this.page.screenshot({ path: file }).catch(() => undefined);
    }
  }

  summary() {
    for (const s of this.skipped) console.log(`skipped: ${s}`);
    console.log(`${this.passed} passed, ${this.failed} failed, ${this.skipped.length} skipped`);
    return this.failed === 0;
  }
}

module.exports = { PYTHON, REPO, EXT, AGENTS, sleep, waitFor, git, makeRepo, writeConfig, agent, call, api, logIds, Gridd, CodeServer, launchBrowser, Runner, freePort };
