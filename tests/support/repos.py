"""Workspace repositories for tests: a real git repository at a short path, and its
``.grid/config.toml`` (agent profiles, fast scheduler settings).

Workspaces live under a short /tmp prefix because Unix socket paths are limited to
~107 bytes and pytest's tmp_path is often deeper than that.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gridd.settings import CLAUDE_PERMISSION_ARGS, CLAUDE_STREAM_ARGS

#: Small executable agents used by the core-loop tests.
AGENTS_DIR = Path(__file__).resolve().parent.parent / "agents"

#: The fake ``claude`` executable that speaks stream-json (tests/fakes/claude).
FAKE_CLAUDE = Path(__file__).resolve().parent.parent / "fakes" / "claude"

#: Scheduler settings that keep the core-loop tests quick.
FAST_SCHEDULER: dict[str, object] = {
    "backoff_seconds": 0.1,
    "backoff_max_seconds": 0.5,
    "stop_grace_seconds": 1.0,
    "tick_seconds": 0.25,
}


def make_repo(parent: Path | None = None) -> Path:
    """A fresh git repository (branch ``main``, one commit) under ``parent`` or /tmp."""
    root = Path(tempfile.mkdtemp(prefix="g", dir=str(parent or "/tmp")))
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, env=env)
    for key, value in (("user.email", "test@example.com"), ("user.name", "gridd tests")):
        subprocess.run(["git", "-C", str(root), "config", key, value], check=True)
    (root / "README.md").write_text("test repo\n")
    subprocess.run(["git", "-C", str(root), "add", "README.md"], check=True)
    subprocess.run(["git", "-C", str(root), "commit", "-q", "-m", "init"], check=True, env=env)
    return root


def remove_repo(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def write_config(root: Path, text: str) -> None:
    grid = root / ".grid"
    grid.mkdir(mode=0o700, exist_ok=True)
    (grid / "config.toml").write_text(text)


def toml_value(value: object) -> str:
    """``value`` written as a TOML value (a dict as an inline table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_core_config(
    root: Path,
    *,
    agents: dict[str, dict[str, object]] | None = None,
    scheduler: dict[str, object] | None = None,
) -> None:
    """``.grid/config.toml`` with agent profiles and (fast by default) scheduler settings."""
    lines = ["[scheduler]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in {**FAST_SCHEDULER, **(scheduler or {})}.items()]
    for name, profile in (agents or {}).items():
        lines.append(f"\n[agents.{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in profile.items()]
    write_config(root, "\n".join(lines) + "\n")


def agent_command(script: str, *args: str) -> list[str]:
    """argv running ``tests/agents/<script>`` with this interpreter."""
    return [sys.executable, str(AGENTS_DIR / script), *args]


def fake_claude_profile(
    *, stdio: bool = True, env: dict[str, str] | None = None
) -> dict[str, object]:
    """An agent profile running the fake claude as gridd runs the real one (``stdio``: with
    ``--permission-prompt-tool stdio``, so every question comes as a control request)."""
    command = [sys.executable, str(FAKE_CLAUDE), *CLAUDE_STREAM_ARGS]
    profile: dict[str, object] = {"adapter": "claude", "stdin": "pipe"}
    if stdio:
        command += CLAUDE_PERMISSION_ARGS
        profile["adapter_options"] = {"permission_prompt_tool": "stdio"}
    profile["command"] = command
    if env:
        profile["env"] = env
    return profile


def read_json_file(path: Path) -> dict[str, object] | None:
    """A JSON object written (atomically) by an agent, or None while it is not there yet."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_text_file(path: Path) -> str | None:
    """A file's text, or None while it is missing or empty."""
    try:
        return path.read_text() or None
    except FileNotFoundError:
        return None


def touch(path: Path) -> None:
    path.write_text("")
