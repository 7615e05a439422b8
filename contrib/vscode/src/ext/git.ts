/** The few git reads the extension makes itself: branch names and a file at a commit. */

import { execFile } from "node:child_process";

export function git(root: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile("git", ["-C", root, ...args], { maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error) reject(new Error(stderr.trim() || error.message));
      else resolve(stdout);
    });
  });
}

/** Local branches, the current one first. */
export async function branches(root: string): Promise<string[]> {
  const out = await git(root, ["for-each-ref", "--sort=-HEAD", "--format=%(refname:short)", "refs/heads"]);
  return out.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("grid/"));
}

/** The file's content at `rev`, or "" when it does not exist there (an added or deleted file). */
export async function showAt(root: string, rev: string, file: string): Promise<string> {
  try {
    return await git(root, ["show", `${rev}:${file}`]);
  } catch {
    return "";
  }
}
