"""The podman engine: each run's box is a container (``runs/boxes.py`` ``Engine``).

A container is created (its name is the run's box name: podman refuses a name in use, which
is the claim), the in-box shim, the spec and the base bundle are copied in as one tar
stream, and it is started with the shim as its main process. Everything else is ``podman
exec`` of the shim's commands. Containers carry the workspace, task and run as labels, so a
restarted daemon (or a person: ``podman ps --filter label=grid.task=...``) finds them.

With no ``image`` configured, the image is built from Debian packages (``runs/image.py``).
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gridd.errors import Conflict
from gridd.runs.boxes import BOXSHIM, BoxError, BoxGone, BoxInfo
from gridd.runs.image import ensure_image
from gridd.settings import PodmanSettings

ROOT = "/grid"
GONE = ("no such container", "no container with name or id", "container state improper")


class PodmanEngine:
    kind = "podman"
    root = ROOT

    def __init__(self, settings: PodmanSettings, *, cache_dir: Path) -> None:
        self.settings = settings
        self.cache_dir = cache_dir
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

    def create(
        self,
        name: str,
        *,
        labels: dict[str, str],
        files: dict[str, bytes],
        options: Mapping[str, Any] | None = None,
    ) -> None:
        image = self.image()
        label_args = [f"--label={k}={v}" for k, v in sorted(labels.items())]
        try:
            self._podman(
                "create",
                f"--name={name}",
                *label_args,
                *self.run_options(),
                image,
                "python3",
                "-I",
                "-S",
                f"{ROOT}/boxshim.py",
                "run",
                ROOT,
            )
        except BoxError as exc:
            if "already in use" in exc.message:
                raise Conflict(f"container {name} exists", code="box_exists") from None
            raise
        try:
            self._podman(
                "cp", "-", f"{name}:/", stdin=_tar({"boxshim.py": BOXSHIM.read_bytes(), **files})
            )
            self._podman("start", name)
        except BoxError:
            self.remove(name)
            raise

    def exec(self, name: str, args: list[str], *, stdin: bytes = b"") -> bytes:
        interactive = ["--interactive"] if stdin else []
        return self._podman(
            "exec",
            *interactive,
            name,
            "python3",
            "-I",
            "-S",
            f"{ROOT}/boxshim.py",
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

    def where(self, name: str) -> dict[str, str]:
        """The container is the box; its node is this machine."""
        return {"node": socket.gethostname()}

    def remove(self, name: str) -> None:
        try:
            self._podman("rm", "--force", "--time=0", name)
        except BoxGone:
            pass


def _tar(files: dict[str, bytes]) -> bytes:
    """``files`` under ``/grid`` as a tar stream (what ``podman cp -`` takes)."""
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo(ROOT.lstrip("/"))
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, now
        tar.addfile(folder)
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{ROOT.lstrip('/')}/{rel}")
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
