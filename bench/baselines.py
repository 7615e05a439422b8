"""What gridd's git work costs when a plain script does it: the baselines benchmarks
measure gridd against, and the git runners (sync and async) those scripts use, with the
identity and environment gridd gives git.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

from bench.common import make_repo, remove_repo

#: What gridd adds to git calls (``gridd.git.worktrees``): identity only when none is configured.
GIT_IDENTITY = ["-c", "user.name=gridd", "-c", "user.email=gridd@localhost"]
#: The branch the merge baseline lands on.
FEATURE = "feature/bench"


def git_env() -> dict[str, str]:
    """The environment gridd gives git (``gridd.git.worktrees.git``)."""
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


def git(root: Path, *args: str) -> str:
    """``git ARGS`` in ``root`` as gridd runs it (its identity and environment); stdout."""
    return subprocess.run(
        ["git", *GIT_IDENTITY, *args],
        cwd=root,
        env=git_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout


async def git_async(cwd: Path, *args: str, env: dict[str, str]) -> str:
    """``git ARGS`` in ``cwd`` as a child of this event loop (terminated if cancelled); stdout."""
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=str(cwd),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate()
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.terminate()  # git removes its lock files on SIGTERM
            await asyncio.shield(proc.wait())
        raise
    if proc.returncode:
        raise RuntimeError(f"git {' '.join(args[:3])}: {err.decode().strip()}")
    return out.decode()


def merge_script_seconds(tasks: int, *, feature: str = FEATURE) -> float:
    """Seconds per merge for a plain script merging ``tasks`` one-file branches."""
    root = make_repo()
    try:
        for i in range(tasks):
            git(root, "checkout", "-q", "-b", f"grid/b{i}", "main")
            (root / f"b{i}.txt").write_text(f"work for b{i}\n")
            git(root, "add", f"b{i}.txt")
            git(root, "commit", "-q", "-m", f"b{i}")
        git(root, "checkout", "-q", "main")
        git(root, "branch", feature, "main")
        integration = root / ".grid" / "integration"
        git(root, "worktree", "add", "-q", "--detach", str(integration), feature)
        started = time.monotonic()
        for i in range(tasks):
            tip = git(root, "rev-parse", feature).strip()
            git(integration, "reset", "-q", "--hard", tip, "--")
            git(
                integration,
                "merge",
                "-q",
                "--no-ff",
                "--no-edit",
                "-m",
                f"merge b{i}",
                f"grid/b{i}",
            )
            new = git(integration, "rev-parse", "HEAD").strip()
            git(root, "update-ref", f"refs/heads/{feature}", new, tip)
        return (time.monotonic() - started) / tasks
    finally:
        remove_repo(root)
