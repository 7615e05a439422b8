"""Running gridd's command lines (``gridd``, ``gridctl``) as a user would: a subprocess,
stdin not a terminal, output captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GRIDD = [sys.executable, "-m", "gridd.cli.gridd_main"]
GRIDCTL = [sys.executable, "-m", "gridd.cli.gridctl"]
GRIDCTL_ENV = {**os.environ, "COLUMNS": "200"}


def run_gridd(root: Path, *, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``gridd`` expecting it to exit by itself (a refused start); output captured."""
    return subprocess.run(
        [*GRIDD, "--workspace", str(root)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def gridctl(
    root: Path,
    *args: str,
    cwd: Path | None = None,
    timeout: float = 30,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``gridctl ARGS`` run in ``root`` (or ``cwd``), stdin not a terminal, output captured."""
    return subprocess.run(
        [*GRIDCTL, *args],
        cwd=cwd or root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or GRIDCTL_ENV,
        check=False,
    )
