"""Where a remote run's box is: the engine protocol, and the box in a local directory.

A box is one run's isolated place (a container, a pod) named by the run: creating it is
the claim (``create`` fails when the name is taken, so a run never has two copies). The
remote executor (``runs/remote.py``) talks to a box only through an engine: put files in
before it starts, start its main process (the in-box shim, ``runs/boxshim.py``), exec
the shim's commands, find boxes again by label, remove one. Engines differ only in where
the box is: ``runs/podman.py`` (containers), ``DirectoryBoxes`` here (a directory and a
process group on this machine: the protocol with no container in the way).

An engine that keeps the shim's own output on this machine (``Announcing``: podman's log
file, a directory box's ``shim.log``) lets a spawn hear "agent started, pid N" there, a
file read, instead of waiting for the mirror's first look (an exec).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gridd.errors import Conflict, GriddError

#: The in-box shim, put into every box.
BOXSHIM = Path(__file__).with_name("boxshim.py")


class BoxGone(GriddError):
    """The box is not there (removed, or its node lost). ``details["reason"]``, when the
    engine can tell why (``ExitStatus.reason``: ``oom_killed``, ``deadline_exceeded``,
    ``evicted``, ``node_lost``, ``box_gone``), becomes the run's exit record."""

    code = "box_gone"

    @property
    def reason(self) -> str | None:
        reason = self.details.get("reason")
        return reason if isinstance(reason, str) else None


class BoxError(GriddError):
    """The engine failed to do what was asked; may pass."""

    code = "box_failed"
    transient = True


@dataclass(frozen=True)
class BoxInfo:
    name: str
    running: bool
    labels: dict[str, str]


class Engine(Protocol):
    """The box's engine. ``root`` is where the box keeps its run (the shim's ``<root>``)."""

    kind: str
    root: str
    #: The run goes into the box after ``create`` made it (a Job's pod waits for it): a
    #: box may exist that never got its run (``RemoteExecutor.fence``). False when
    #: ``create`` starts the box with its run already in (podman's staged mount).
    input_after_create: bool

    def create(
        self,
        name: str,
        *,
        labels: dict[str, str],
        files: dict[str, bytes],
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the box (``Conflict`` when the name is taken) with ``files`` (paths
        relative to ``root``) in it, and start the in-box shim's ``run``. ``options``: the
        profile's changes to the engine's settings for this box (``Launch.box``)."""

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        """Run ``boxshim.py <args>`` in the box; its stdout. ``BoxGone``, ``BoxError``."""

    def find(self, labels: dict[str, str]) -> list[BoxInfo]:
        """The boxes carrying all of ``labels``."""

    def info(self, name: str) -> BoxInfo | None: ...

    def where(self, name: str) -> dict[str, str]:
        """Where the created box runs, shown beside the engine and the box's name
        (``Agent.executor``): its ``node``, and its ``pod`` where that is not the box."""

    def remove(self, name: str) -> None:
        """Remove the box and all in it (nothing when it is not there)."""

    def abandon(self, name: str) -> None:
        """A stop came while ``create(name)`` may be in flight: if the box's run has not
        started, ``create`` gives up, removes the box and raises ``StartAbandoned``. Never
        blocks; nothing when no such create is under way."""

    def close(self) -> None:
        """Let go of what the engine holds open (a watch); the boxes go on."""


@runtime_checkable
class Announcing(Protocol):
    """An engine that can tell what the in-box shim said on its own output (its "news":
    ``boxshim.py`` ``_announce``) without an exec: a read of a file on this machine."""

    def news(self, name: str) -> dict[str, Any] | None:
        """The shim's last word: ``{"agent": {...}}`` once it started the agent (what its
        ``agent.json`` holds), ``{"exit": {...}}`` when it could not; None before it said
        either (or when the box is not there). Cheap: called every few milliseconds."""


def shim_news(lines: Iterable[bytes]) -> dict[str, Any] | None:
    """The last news line (a JSON object naming ``agent`` or ``exit``) among the shim's
    output lines; anything else there (a traceback, git's complaints) is passed over."""
    found = None
    for line in lines:
        if not line.startswith(b"{"):
            continue
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if isinstance(said, dict) and ("agent" in said or "exit" in said):
            found = said
    return found


def write_private(path: Path, data: bytes) -> None:
    """A new file only its owner reads (the spec carries the model's environment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


class DirectoryBoxes:
    """Boxes as directories under ``base`` on this machine, the shim started detached in
    its own session. No isolation: it proves the protocol (nothing shared with the daemon
    but what goes through ``create`` and ``exec``) where no container engine is."""

    kind = "directory"
    input_after_create = False  # its files are written before the shim starts

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = ""  # per box: the directory itself

    def _dir(self, name: str) -> Path:
        return self.base / name

    def close(self) -> None:
        pass

    def abandon(self, name: str) -> None:
        """Nothing: creating a directory box does not wait for anything."""

    def where(self, name: str) -> dict[str, str]:
        return {"node": socket.gethostname()}

    def create(
        self,
        name: str,
        *,
        labels: dict[str, str],
        files: dict[str, bytes],
        options: Mapping[str, Any] | None = None,
    ) -> None:
        box = self._dir(name)
        self.base.mkdir(parents=True, exist_ok=True)
        try:
            box.mkdir(mode=0o700)
        except FileExistsError:
            raise Conflict(f"box {name} exists", code="box_exists") from None
        (box / "labels").write_text("".join(f"{k}={v}\n" for k, v in sorted(labels.items())))
        write_private(box / "boxshim.py", BOXSHIM.read_bytes())
        for rel, data in files.items():
            write_private(box / rel, data)
        # Through sh, so that the shim is nobody's child here: it outlives the daemon as a
        # container does, and no daemon leaves it a zombie. Its own session: one group.
        launched = subprocess.run(
            [
                "/bin/sh",
                "-c",
                '"$@" >>"$0/shim.log" 2>&1 </dev/null & echo $!',
                str(box),
                sys.executable,
                "-I",
                "-S",
                str(box / "boxshim.py"),
                "run",
                str(box),
            ],
            capture_output=True,
            check=True,
            start_new_session=True,
        )
        pid = int(launched.stdout)
        (box / "shim.pid").write_text(f"{pid} {os.getpgid(pid)}")

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        box = self._dir(name)
        if not box.is_dir():
            raise BoxGone(f"box {name} is gone", details={"box": name})
        if not self._running(box):  # as a container whose main process died: no exec
            raise BoxGone(f"box {name} has stopped", details={"box": name})
        argv = [sys.executable, "-I", "-S", str(box / "boxshim.py"), args[0], str(box), *args[1:]]
        done = subprocess.run(argv, input=stdin, capture_output=True, check=False)
        if done.returncode != 0:
            if not box.is_dir():
                raise BoxGone(f"box {name} is gone", details={"box": name})
            raise BoxError(
                f"box {name}: {args[0]} failed: {done.stderr.decode(errors='replace')[-500:]}",
                details={"box": name},
            )
        return done.stdout

    def news(self, name: str) -> dict[str, Any] | None:
        try:
            raw = (self._dir(name) / "shim.log").read_bytes()
        except OSError:
            return None
        return shim_news(raw.splitlines())

    def _labels(self, box: Path) -> dict[str, str]:
        try:
            lines = (box / "labels").read_text().splitlines()
        except OSError:
            return {}
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def _running(self, box: Path) -> bool:
        try:
            pid = int((box / "shim.pid").read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return False
        return True

    def info(self, name: str) -> BoxInfo | None:
        box = self._dir(name)
        if not box.is_dir():
            return None
        return BoxInfo(name, self._running(box), self._labels(box))

    def find(self, labels: dict[str, str]) -> list[BoxInfo]:
        if not self.base.is_dir():
            return []
        found = []
        for box in sorted(self.base.iterdir()):
            have = self._labels(box)
            if all(have.get(k) == v for k, v in labels.items()):
                found.append(BoxInfo(box.name, self._running(box), have))
        return found

    def remove(self, name: str) -> None:
        box = self._dir(name)
        try:  # the agent has a session of its own in the box
            agent = json.loads((box / "run" / "agent.json").read_text())
            os.killpg(int(agent["pid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        try:
            group = int((box / "shim.pid").read_text().split()[1])
            os.killpg(group, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass
        shutil.rmtree(box, ignore_errors=True)
