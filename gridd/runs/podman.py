"""The podman engine: each run's box is a container (``runs/boxes.py`` ``Engine``).

A container is run detached (its name is the run's box name: podman refuses a name in use,
which is the claim) with the shim as its main process. What the daemon puts in (the in-box
shim, the spec, the base bundle) is staged in a directory of its own on this machine (0700,
its files 0600) and bind-mounted read-only at ``/grid/in``: one ``podman run``, no copy.
The shim's own output goes to a log file beside it (``--log-driver=k8s-file``), where a
spawn reads its news ("agent started, pid N": ``boxes.Announcing``) without an exec.
Everything else is ``podman exec`` of the shim's commands, the protocol every engine shares.
Containers carry the workspace, task and run as labels, so a restarted daemon (or a person:
``podman ps --filter label=grid.task=...``) finds them.

With no ``image`` configured, the image is built from Debian packages (``runs/image.py``).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gridd.errors import Conflict
from gridd.runs.boxes import BOXSHIM, BoxError, BoxGone, BoxInfo, shim_news, write_private
from gridd.runs.image import ensure_image
from gridd.settings import PodmanSettings

ROOT = "/grid"
GONE = ("no such container", "no container with name or id", "container state improper")


class PodmanEngine:
    kind = "podman"
    root = ROOT
    input_after_create = False  # staged and mounted at ``podman run``

    def __init__(
        self, settings: PodmanSettings, *, cache_dir: Path, stage_dir: Path | None = None
    ) -> None:
        self.settings = settings
        self.cache_dir = cache_dir
        #: Each box's staged inputs (``<name>/``, mounted into it) and its log (``<name>.log``).
        self.stage_dir = stage_dir or cache_dir.parent / "boxes"
        self._image = settings.image
        self._image_lock = threading.Lock()

    def image(self) -> str:
        """The image to run: the configured one, or the Debian one, built once (cached)."""
        with self._image_lock:
            if not self._image:
                self._image = ensure_image(
                    self.settings.command,
                    suite=self.settings.suite,
                    packages=self.settings.packages,
                    cache_dir=self.cache_dir,
                )
            return self._image

    def _podman(self, *args: str, stdin: bytes = b"", timeout: float = 120.0) -> bytes:
        argv = [*self.settings.command, *args]
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BoxError(f"podman {args[0]} failed: {exc}") from exc
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()
            if any(word in err.lower() for word in GONE):
                raise BoxGone(f"container is gone: {err[-300:]}")
            raise BoxError(f"podman {args[0]} failed ({done.returncode}): {err[-500:]}")
        return done.stdout

    def run_options(self) -> list[str]:
        """The options every container is created with (docs/executors.md)."""
        s = self.settings
        options = [f"--network={s.network}"]
        if s.runtime:
            options.append(f"--runtime={s.runtime}")
        options += [f"--ulimit={u}" for u in s.ulimits]
        options += [f"--volume={m}" for m in s.mounts]
        if s.memory:
            options.append(f"--memory={s.memory}")
        return options

    def _staged(self, name: str) -> Path:
        return self.stage_dir / name

    def _log(self, name: str) -> Path:
        return self.stage_dir / f"{name}.log"

    def create(
        self,
        name: str,
        *,
        labels: dict[str, str],
        files: dict[str, bytes],
        options: Mapping[str, Any] | None = None,
    ) -> None:
        image = self.image()
        stage = self._staged(name)
        self.stage_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if stage.exists():
            if self.info(name) is not None:  # the box's own: never touched
                raise Conflict(f"container {name} exists", code="box_exists")
            shutil.rmtree(stage)  # left by a box that is gone
        stage.mkdir(mode=0o700)
        for rel, data in {"boxshim.py": BOXSHIM.read_bytes(), **files}.items():
            write_private(stage / rel, data)
        label_args = [f"--label={k}={v}" for k, v in sorted(labels.items())]
        try:
            self._podman(
                "run",
                "--detach",
                f"--name={name}",
                *label_args,
                *self.run_options(),
                f"--mount=type=bind,src={stage},dst={ROOT}/in,ro=true",
                "--log-driver=k8s-file",
                f"--log-opt=path={self._log(name)}",
                image,
                "python3",
                "-I",
                "-S",
                f"{ROOT}/in/boxshim.py",
                "run",
                ROOT,
            )
        except BoxError as exc:
            if "already in use" in exc.message:  # the claim: whatever is staged is its
                raise Conflict(f"container {name} exists", code="box_exists") from None
            self.remove(name)  # created but not started, perhaps
            raise

    def news(self, name: str) -> dict[str, Any] | None:
        """What the shim said on its stdout, from the container's log file: k8s-file lines
        ``<time> <stream> <P|F> <text>``, a ``P`` (partial) line continued by the next."""
        try:
            raw = self._log(name).read_bytes()
        except OSError:
            return None
        lines, part = [], b""
        for line in raw.splitlines():
            fields = line.split(b" ", 3)
            if len(fields) < 3 or fields[1] != b"stdout":
                continue
            part += fields[3] if len(fields) == 4 else b""
            if fields[2] != b"P":
                lines.append(part)
                part = b""
        return shim_news(lines)

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        interactive = ["--interactive"] if stdin else []
        return self._podman(
            "exec",
            *interactive,
            name,
            "python3",
            "-I",
            "-S",
            f"{ROOT}/in/boxshim.py",
            args[0],
            ROOT,
            *args[1:],
            stdin=stdin,
        )

    def find(self, labels: dict[str, str]) -> list[BoxInfo]:
        filters = [f"--filter=label={k}={v}" for k, v in sorted(labels.items())]
        raw = self._podman("ps", "--all", *filters, "--format=json")
        found = []
        for row in json.loads(raw or b"[]"):
            names = row.get("Names") or [""]
            found.append(BoxInfo(names[0], row.get("State") == "running", row.get("Labels") or {}))
        return found

    def info(self, name: str) -> BoxInfo | None:
        try:
            raw = self._podman("container", "inspect", name, "--format=json")
        except BoxGone:
            return None
        except BoxError as exc:
            if "no such" in exc.message.lower():
                return None
            raise
        [row] = json.loads(raw)
        state = row.get("State") or {}
        labels = (row.get("Config") or {}).get("Labels") or {}
        return BoxInfo(name, bool(state.get("Running")), labels)

    def close(self) -> None:
        pass

    def abandon(self, name: str) -> None:
        """Nothing: a container's create waits for no scheduler; a run it started is
        stopped through its handle."""

    def where(self, name: str) -> dict[str, str]:
        """The container is the box; its node is this machine."""
        return {"node": socket.gethostname()}

    def remove(self, name: str) -> None:
        try:
            self._podman("rm", "--force", "--time=0", name)
        except BoxGone:
            pass
        shutil.rmtree(self._staged(name), ignore_errors=True)
        self._log(name).unlink(missing_ok=True)
