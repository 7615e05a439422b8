"""What the real-CLI tests (Claude Code, Codex, Gemini CLI, opencode) share: where each
pinned CLI is installed, the newest agent of a task, the argv a run was started with,
wall-clock times read back from the API, and the CLI's own output shown when a test fails.

The CLIs, their npm packages and their pinned versions are listed once, in
``tests/tools/agent-clis.txt``; ``tests/tools/install-cli.sh`` installs each under
``.cache/clis/<name>/`` (``make test`` does), or under ``$GRIDD_AGENT_CLIS/<name>/`` when that
is set (``make test-agents-latest`` points it at the newest versions).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gridd.client import GridClient

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "tests" / "tools" / "agent-clis.txt"


def clis_root() -> Path:
    """Where the CLIs under test are installed, one directory each."""
    return Path(os.environ.get("GRIDD_AGENT_CLIS") or ROOT / ".cache" / "clis")


def pin(name: str) -> dict[str, str]:
    """The line of ``agent-clis.txt`` for ``name``: package, version, platform, program."""
    for line in PINS.read_text().splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#") and fields[0] == name:
            keys = ("name", "package", "version", "platform", "program")
            return dict(zip(keys, fields, strict=True))
    raise KeyError(f"no CLI named {name!r} in {PINS}")


def program(name: str) -> Path:
    """The CLI's program (a native binary, or gemini's bundled JavaScript file)."""
    return clis_root() / name / pin(name)["program"]


def installed_version(name: str) -> str | None:
    """The version of ``name`` the tests will run, or None when it is not installed."""
    said = clis_root() / name / "version"
    return said.read_text().strip() if said.exists() and program(name).exists() else None


def needs(name: str) -> pytest.MarkDecorator:
    """Skip the test unless the CLI is installed."""
    return pytest.mark.skipif(
        installed_version(name) is None,
        reason=f"run tests/tools/install-cli.sh {name} (make test does)",
    )


def agent_of(c: GridClient, task_id: str) -> dict[str, Any]:
    """The task's newest agent run, exited or not."""
    agents = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == task_id]
    return agents[-1]  # type: ignore[no-any-return]


def spec_argv(agent: dict[str, Any]) -> list[str]:
    """The argv the run was started with (its run directory's spec.json)."""
    spec = json.loads((Path(agent["runDir"]) / "spec.json").read_text())
    return [str(a) for a in spec["argv"]]


def epoch(value: str) -> float:
    """Epoch seconds of an API timestamp."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@contextmanager
def shown_on_failure(repo: Path, *, last: int = 40) -> Iterator[None]:
    """Print the last lines each run of the test printed (``output.log``) when the block
    ends: pytest shows what a test printed only when it fails, so a failing test shows what
    the CLI said, and its program's path (drift in a newer version is read from there)."""
    try:
        yield
    finally:
        for log in sorted((repo / ".grid" / "runs").glob("*/output.log")):
            spec = log.parent / "spec.json"
            argv = json.loads(spec.read_text()).get("argv", []) if spec.exists() else []
            print(f"--- the last {last} lines of {log} ({' '.join(map(str, argv))[:200]}) ---")
            print("\n".join(log.read_text(errors="replace").splitlines()[-last:]))
