/**
 * Version skew between this extension and the daemon, decided from `GET /version`.
 *
 * `apiVersion` is the contract: a different one means paths or shapes may differ, so the
 * user is told which side to upgrade. The package version is only shown.
 */

import { isRecord } from "./errors";

/** The wire API this extension was written against. */
export const API_VERSION = 1;

export interface Skew {
  readonly ok: boolean;
  readonly message: string;
}

export function checkVersion(body: unknown, expected: number = API_VERSION): Skew {
  if (!isRecord(body) || typeof body["apiVersion"] !== "number") {
    return { ok: false, message: "gridd did not report an apiVersion; it is too old for this extension. Upgrade gridd." };
  }
  const api = body["apiVersion"];
  const version = typeof body["version"] === "string" ? body["version"] : "?";
  if (api === expected) return { ok: true, message: `gridd ${version} (API ${api})` };
  const upgrade = api < expected ? "Upgrade gridd" : "Upgrade the gridd extension";
  return {
    ok: false,
    message: `gridd ${version} speaks API ${api}, this extension speaks API ${expected}. ${upgrade}; until then some views and actions may fail.`,
  };
}
