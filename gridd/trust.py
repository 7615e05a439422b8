"""Trust: a ``.grid/config.toml`` that came with the repository runs nothing until the user
says so, the way direnv's ``allow`` works.

A config names commands (``agents.<name>.command``, ``notifications.command``,
``beads.command``); starting gridd runs them. A config the user wrote in their own clone
(untracked: gridd adds ``.grid/`` to ``.git/info/exclude``) is theirs and trusted. One that
is committed to the repository came from whoever pushed it: it must be trusted explicitly
with ``gridctl trust``, which records the sha256 of its contents for its absolute path in
``$XDG_STATE_HOME/gridd/trusted.json`` (default ``~/.local/state/gridd/``), outside any
repository. Any change to the file (a ``git pull``) needs trusting again.

    {"trusted": {"/abs/repo/.grid/config.toml": {"sha256": "...", "at": "2026-..."}}}
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gridd.errors import ConfigError


def trust_file(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_STATE_HOME") or str(
        Path(environ.get("HOME", "~")).expanduser() / ".local" / "state"
    )
    return Path(base) / "gridd" / "trusted.json"


#: argv settings whose names do not say "command" (the merge queue's gate check).
RUNNABLE_KEYS = frozenset({"merge.check"})


def command_keys(data: Any, prefix: str = "") -> list[str]:
    """The dotted keys of a parsed config that name something gridd would run."""
    keys: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            dotted = f"{prefix}{key}"
            runnable = "command" in str(key) or dotted in RUNNABLE_KEYS
            if runnable and value not in (None, [], ""):
                keys.append(dotted)
            else:
                keys += command_keys(value, dotted + ".")
    return keys


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def committed(root: Path, path: Path) -> bool:
    """Whether ``path`` is tracked by the git repository at ``root``."""
    proc = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--error-unmatch", "--", str(path)],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def _entries(environ: Mapping[str, str]) -> dict[str, Any]:
    try:
        data = json.loads(trust_file(environ).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    trusted = data.get("trusted") if isinstance(data, dict) else None
    return trusted if isinstance(trusted, dict) else {}


def recorded(path: Path, environ: Mapping[str, str]) -> str | None:
    entry = _entries(environ).get(str(path.resolve()))
    if isinstance(entry, dict):
        value = entry.get("sha256")
        return str(value) if value else None
    return entry if isinstance(entry, str) else None


@dataclass(frozen=True)
class Verdict:
    trusted: bool
    reason: str
    commands: tuple[str, ...] = ()


def assess(root: Path, config: Path, environ: Mapping[str, str]) -> Verdict:
    """Whether the commands in ``config`` may run, and why."""
    try:
        raw = config.read_bytes()
    except FileNotFoundError:
        return Verdict(True, "no config")
    import tomllib  # here, not at the top: most workspaces have no config.toml

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return Verdict(True, "not valid TOML (reported when loaded)")
    keys = tuple(command_keys(data))
    if not keys:
        return Verdict(True, "names no command")
    if not committed(root, config):
        return Verdict(True, "written in this clone, not committed", keys)
    known = recorded(config, environ)
    if known == digest(raw):
        return Verdict(True, "trusted with gridctl trust", keys)
    why = "changed since it was trusted" if known else "not trusted yet"
    return Verdict(False, why, keys)


def require(root: Path, config: Path, environ: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` (``config_untrusted``) saying how to trust, when untrusted."""
    verdict = assess(root, config, environ)
    if verdict.trusted:
        return
    raise ConfigError(
        f"{config} is committed to this repository, names commands to run"
        f" ({', '.join(verdict.commands)}) and is {verdict.reason}: gridd runs nothing from"
        f" it until you trust it. Read it, then run: gridctl trust"
        f" (records its sha256 in {trust_file(environ)})",
        code="config_untrusted",
        details={"path": str(config), "commands": list(verdict.commands), "why": verdict.reason},
    )


def record(config: Path, environ: Mapping[str, str]) -> str:
    """Trust ``config`` as it is now; returns the recorded sha256."""
    sha = digest(config.read_bytes())
    path = trust_file(environ)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    entries = _entries(environ)
    entries[str(config.resolve())] = {"sha256": sha, "at": datetime.now(UTC).isoformat()}
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"trusted": entries}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return sha
