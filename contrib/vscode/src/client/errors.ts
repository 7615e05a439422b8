/**
 * What went wrong, in a user's words: gridd's `{"error": {code, message, details}}` answers
 * and socket failures become one message plus the next action worth offering.
 *
 * The mapping is a pure function of the error; nothing here retries anything.
 */

export interface ErrorBody {
  readonly code: string;
  readonly message: string;
  readonly details: Record<string, unknown>;
}

/** An answer from gridd with a 4xx/5xx status. */
export class GriddError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
    this.name = "GriddError";
  }
}

/** The socket could not be reached or the connection broke. */
export class TransportError extends Error {
  constructor(
    message: string,
    /** The Node error code: ENOENT, ECONNREFUSED, ECONNRESET, ETIMEDOUT, ... */
    readonly errno: string | undefined,
  ) {
    super(message);
    this.name = "TransportError";
  }

  /** Nothing is listening: no socket file, or a socket nobody accepts on. */
  get daemonDown(): boolean {
    return this.errno === "ENOENT" || this.errno === "ECONNREFUSED";
  }
}

/** Parse an error answer's body; anything unexpected still yields a usable error. */
export function parseErrorBody(status: number, text: string): GriddError {
  try {
    const parsed: unknown = JSON.parse(text);
    if (isRecord(parsed) && isRecord(parsed["error"])) {
      const err = parsed["error"];
      const code = typeof err["code"] === "string" ? err["code"] : `http_${status}`;
      const message = typeof err["message"] === "string" ? err["message"] : `gridd answered ${status}`;
      const details = isRecord(err["details"]) ? err["details"] : {};
      return new GriddError(status, code, message, details);
    }
  } catch {
    // not JSON: fall through
  }
  const snippet = text.trim().slice(0, 200);
  return new GriddError(status, `http_${status}`, `gridd answered ${status}${snippet ? `: ${snippet}` : ""}`);
}

/** The action a message offers; `command` is a VS Code command id of this extension. */
export interface NextAction {
  readonly label: string;
  readonly command: string;
}

export interface Explained {
  readonly message: string;
  readonly severity: "error" | "warning" | "info";
  readonly action?: NextAction;
}

const SHOW_LOG: NextAction = { label: "Show gridd Log", command: "gridd.showLog" };
const REFRESH: NextAction = { label: "Refresh", command: "gridd.refresh" };

/** One message and a next action for any error a gridd call can raise. */
export function explain(error: unknown): Explained {
  if (error instanceof GriddError) return explainGridd(error);
  if (error instanceof TransportError) {
    if (error.daemonDown) {
      return {
        message: "gridd is not running in this folder.",
        severity: "warning",
        action: { label: "Start gridd", command: "gridd.startDaemon" },
      };
    }
    return { message: `Lost the connection to gridd (${error.message}).`, severity: "warning", action: REFRESH };
  }
  const text = error instanceof Error ? error.message : String(error);
  return { message: text, severity: "error" };
}

function explainGridd(e: GriddError): Explained {
  const msg = e.message;
  switch (e.code) {
    case "task_not_found":
    case "agent_not_found":
    case "question_not_found":
    case "task_exists":
    case "task_finished":
    case "task_working":
    case "task_not_working":
    case "task_not_in_review":
    case "task_not_startable":
    case "question_answered":
    case "question_closed":
    case "agent_exited":
    case "agent_not_running":
      // The view was behind the daemon: say what happened and offer a fresh view.
      return { message: msg, severity: "warning", action: REFRESH };
    case "dependencies_not_done":
      return { message: `${msg} Approve or finish its dependencies first.`, severity: "warning" };
    case "session_running":
      return {
        message: `${msg} Stop the running session first.`,
        severity: "warning",
        action: { label: "Stop Session", command: "gridd.stopSession" },
      };
    case "worktree_dirty": {
      const files = Array.isArray(e.details["files"]) ? (e.details["files"] as unknown[]).map(String) : [];
      return {
        message: `${msg}${files.length ? ` (${files.join(", ")})` : ""} This daemon refuses uncommitted review edits ([merge] review_edits = "refuse"): commit or discard them in the task's worktree, then approve again.`,
        severity: "warning",
      };
    }
    case "agent_not_listening":
      return { message: `${msg} This agent's profile has stdin = "null"; it cannot take input.`, severity: "warning" };
    case "stdin_full":
      return { message: `${msg} The agent is not reading its input; try again once it has caught up.`, severity: "warning" };
    case "option_not_offered":
      return { message: `${msg} Pick one of the offered options.`, severity: "warning" };
    case "validation_failed":
      return { message: withProblems(msg, e.details), severity: "error" };
    case "disk_full":
      return { message: `${msg} Free some disk space; nothing was recorded.`, severity: "error", action: SHOW_LOG };
    case "store_error":
      return { message: `${msg} gridd's database is unavailable.`, severity: "error", action: SHOW_LOG };
    case "forbidden":
      return { message: `${msg} The daemon runs as another user.`, severity: "error" };
    case "not_found":
    case "method_not_allowed":
      return {
        message: `${msg} This gridd may be older than the extension; upgrade it.`,
        severity: "error",
        action: { label: "Show Version", command: "gridd.showVersion" },
      };
    default:
      if (e.status >= 500) return { message: msg, severity: "error", action: SHOW_LOG };
      return { message: msg, severity: e.status >= 422 ? "error" : "warning" };
  }
}

function withProblems(message: string, details: Record<string, unknown>): string {
  const problems = details["problems"];
  if (!Array.isArray(problems) || problems.length === 0) return message;
  const parts = problems
    .filter(isRecord)
    .map((p) => `${String(p["field"] ?? "?")}: ${String(p["problem"] ?? "invalid")}`);
  return parts.length ? `${message} (${parts.join("; ")})` : message;
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
