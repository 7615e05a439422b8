"""A run's sandbox: what its agent may write and what it may not read, from its profile.

The policy is decided here, in the daemon, when a run is spawned (``sandbox_for``); the
kernel enforces it: the shim's child applies it with Landlock just before ``exec``
(``runs/landlock_rules.py``), so it binds the agent and everything it starts, whatever the
daemon does later (a restart leaves a running agent's sandbox exactly as it was).

- ``workspace``: the agent writes its own worktree, a private ``TMPDIR`` (``tmp/`` in its
  run directory) and the profile's ``writable`` paths (by default its CLI's own state, e.g.
  ``~/.claude`` and ``~/.claude.json`` for the claude adapter); everything else it may read,
  except the ``hidden`` paths.
- ``read-only``: the same without the worktree.
- ``off``: no sandbox (the default, as before the sandbox existed).

And its network: ``allow`` (as the user has it), ``none`` (no TCP connect or bind), or
``allowlist``: only the profile's ``allow_hosts`` (by default its CLI's API host), through
the run's filtering proxy (``runs/egress.py``), whose port is the one TCP port the kernel
lets it connect to.

Always hidden, whatever the profile says: the workspace's ``.grid/`` (the state database,
the socket's directory, other runs' directories and every task's worktree; the run's own
worktree, ``TMPDIR``, output log and heartbeat file are granted back).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridd.errors import GriddError
from gridd.settings import SandboxSettings

#: Per adapter: what its CLI writes besides the worktree, when the profile lists nothing.
#: A path written with a trailing ``/`` is a directory: made (0700) if missing when a run
#: starts; any other missing one is made an empty file (0600). Landlock grants an inode, so
#: what does not exist could not be written (a CLI's first run makes its state).
ADAPTER_WRITABLE: dict[str, tuple[str, ...]] = {"claude": ("~/.claude/", "~/.claude.json")}
#: Per adapter: the hosts its CLI needs with ``network = "allowlist"``, when the profile
#: lists none. Claude Code's: its API, and where a subscriber's login token is refreshed.
ADAPTER_HOSTS: dict[str, tuple[str, ...]] = {
    "claude": ("api.anthropic.com", "platform.claude.com"),
    "codex": ("api.openai.com", "chatgpt.com"),
    "gemini": ("generativelanguage.googleapis.com", "cloudcode-pa.googleapis.com"),
}


@dataclass(frozen=True)
class Sandbox:
    """One run's sandbox, every path absolute and resolved."""

    mode: str
    writable: tuple[str, ...]
    hidden: tuple[str, ...]
    #: Files the agent may append to, never truncate: its output log, its heartbeat file.
    appendable: tuple[str, ...]
    tmpdir: str
    #: The writable paths that are directories (the others are files, when made).
    directories: frozenset[str] = frozenset()
    #: "allow", "none" or "allowlist" (``hosts`` only, through the proxy on ``proxy_port``).
    network: str = "allow"
    hosts: tuple[str, ...] = ()
    proxy_port: int | None = None

    def make_missing(self) -> None:
        """Make each writable path that does not exist yet: a directory (0700) or an
        empty file (0600), as its spelling says."""
        for path in self.writable:
            if os.path.lexists(path):
                continue
            if path in self.directories:
                os.makedirs(path, mode=0o700, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def spec(self, *, abi: int | None = None) -> dict[str, object]:
        """The form the shim reads (``spec.marshal``); ``abi``: a ceiling on the kernel's
        Landlock ABI (the test seam for a kernel without it)."""
        spec: dict[str, object] = {
            "mode": self.mode,
            "writable": list(self.writable),
            "hidden": list(self.hidden),
            "appendable": list(self.appendable),
            "network": self.network,
            "connect_ports": [self.proxy_port] if self.proxy_port else [],
        }
        if abi is not None:
            spec["abi"] = abi
        return spec

    def wire(self) -> dict[str, Any]:
        """What ``/agents/{id}`` shows (and a restarted daemon reopens the proxy from)."""
        wire: dict[str, Any] = {
            "mode": self.mode,
            "writable": list(self.writable),
            "hidden": list(self.hidden),
            "network": self.network,
        }
        if self.network == "allowlist":
            wire |= {"allowHosts": list(self.hosts), "proxyPort": self.proxy_port}
        return wire


def _expand(path: str, home: Path) -> str:
    if path == "~" or path.startswith("~/"):
        path = str(home) + path[1:]
    return os.path.realpath(path)


def sandbox_for(
    settings: SandboxSettings,
    *,
    adapter: str,
    worktree: Path,
    run_dir: Path,
    grid_dir: Path,
    home: Path,
) -> Sandbox | None:
    """The sandbox of a run of a profile with these ``settings`` (None: mode ``off``).
    ``~`` in the profile's paths is ``home``; relative paths are the worktree's."""
    if settings.mode == "off":
        return None
    listed = settings.writable if settings.writable is not None else ADAPTER_WRITABLE.get(adapter)
    tmpdir = os.path.realpath(run_dir / "tmp")
    writable = [tmpdir]
    if settings.mode == "workspace":
        writable.insert(0, os.path.realpath(worktree))
    spelled = [str(worktree / p) if not p.startswith(("/", "~")) else p for p in listed or ()]
    writable += [_expand(p, home) for p in spelled]
    directories = {tmpdir, *(_expand(p, home) for p in spelled if p.endswith("/"))}
    hidden = [_expand(p, home) for p in settings.hidden]
    hidden.append(os.path.realpath(grid_dir))
    for path in writable:
        covered = [h for h in hidden if h == path or h.startswith(path.rstrip("/") + "/")]
        if covered:  # writing a directory means reading all below it: nothing stays hidden
            raise GriddError(
                f"sandbox: the writable path {path} holds the hidden path {covered[0]}; take"
                " it out of the profile's [agents.<name>.sandbox] writable",
                code="sandbox_invalid",
                details={"writable": path, "hidden": covered[0]},
            )
    appendable = tuple(
        os.path.realpath(run_dir / name) for name in ("output.log", "heartbeat.ndjson")
    )
    hosts = settings.allow_hosts
    if hosts is None:
        hosts = list(ADAPTER_HOSTS.get(adapter, ()))
    return Sandbox(
        network=settings.network,
        hosts=tuple(hosts) if settings.network == "allowlist" else (),
        mode=settings.mode,
        writable=tuple(dict.fromkeys(writable)),
        hidden=tuple(dict.fromkeys(hidden)),
        appendable=appendable,
        tmpdir=tmpdir,
        directories=frozenset(directories),
    )
