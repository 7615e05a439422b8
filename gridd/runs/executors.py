"""Choosing the executor of each run: on this machine, or in a box of an engine.

The pool holds one ``Executor``; this is it when runs may go to more than one place. A
spawn goes where its profile says (``Launch.executor``: the profile's ``executor``, or
``[executors] default``). A run of an earlier daemon goes back to where it went: a run
directory with ``remote.json`` is a box's (``runs/remote.py``), any other is local.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gridd.model import Agent
from gridd.runs.executor import AgentHandle, Executor, Launch
from gridd.runs.local import LocalExecutor
from gridd.settings import Settings
from gridd.workspace import Workspace

if TYPE_CHECKING:
    from gridd.runs.remote import RemoteExecutor


def build_executor(
    workspace: Workspace, settings: Settings, *, environ: Mapping[str, str] | None = None
) -> RoutedExecutor:
    """The local shim executor, and the podman and kubernetes ones, each built when a run
    first goes to it (until then: no podman call, no cluster client, no thread, and their
    modules not imported). ``environ``: the daemon's own environment, kept out of boxes."""
    local = LocalExecutor(
        workspace.runs_dir,
        spawn_timeout=settings.scheduler.spawn_timeout_seconds,
        grid_dir=workspace.grid_dir,
        orphan_grace=settings.scheduler.orphan_grace_seconds,
        landlock_abi=settings.daemon.landlock_abi,
    )
    podman = settings.executors.podman
    kubernetes = settings.executors.kubernetes
    spawn_timeout = max(settings.scheduler.spawn_timeout_seconds, 30.0)

    def podman_executor() -> RemoteExecutor:
        # Imported here: a daemon whose runs are all local never loads the engine.
        from gridd.runs.image import default_cache_dir
        from gridd.runs.podman import PodmanEngine
        from gridd.runs.remote import RemoteExecutor

        return RemoteExecutor(
            PodmanEngine(podman, cache_dir=default_cache_dir()),
            workspace=workspace.root,
            spawn_timeout=spawn_timeout,
            look_seconds=podman.look_seconds,
            environ=environ,
            forward_env=podman.env,
        )

    def kubernetes_executor() -> RemoteExecutor:
        # Imported here: a daemon whose runs are all local never loads the engine.
        from gridd.runs.kubernetes import KubernetesEngine
        from gridd.runs.remote import RemoteExecutor

        return RemoteExecutor(
            KubernetesEngine(kubernetes),
            workspace=workspace.root,
            spawn_timeout=spawn_timeout,
            look_seconds=kubernetes.look_seconds,
            environ=environ,
            forward_env=kubernetes.env,
        )

    return RoutedExecutor(local, {"podman": podman_executor, "kubernetes": kubernetes_executor})


class RoutedExecutor:
    """``remotes``: how to build the executor of each engine kind, done on its first run."""

    def __init__(
        self, local: Executor, remotes: Mapping[str, Callable[[], RemoteExecutor]]
    ) -> None:
        self.local = local
        self.builders = dict(remotes)
        self.remotes: dict[str, RemoteExecutor] = {}
        self._building = threading.Lock()

    def start(self) -> None:
        self.local.start()

    def close(self) -> None:
        for remote in self.remotes.values():
            remote.close()
        self.local.close()

    def _built(self, kind: str) -> RemoteExecutor:
        with self._building:  # a reattach asks from a thread (``pool/reattaching.py``)
            remote = self.remotes.get(kind)
            if remote is None:
                remote = self.remotes[kind] = self.builders[kind]()
                remote.start()
            return remote

    def _of(self, run_dir: Path) -> Executor:
        remote = self._remote(run_dir)
        return self.local if remote is None else remote

    def _remote(self, run_dir: Path) -> RemoteExecutor | None:
        from gridd.runs.remote import REMOTE  # here: an idle daemon reattaches no run

        try:
            engine = json.loads((run_dir / REMOTE).read_text())["engine"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return self._built(engine) if engine in self.builders else None

    async def spawn(self, launch: Launch) -> AgentHandle:
        if launch.executor == "local":
            return await self.local.spawn(launch)
        return await self._built(launch.executor).spawn(launch)

    def abandon_start(self, run_dir: Path) -> None:
        # Every engine built (a run's engine is built before its spawn begins): only the one
        # whose spawn of ``run_dir`` is in flight acts on it.
        for remote in self.remotes.values():
            remote.abandon_start(run_dir)

    def reattach(self, agent: Agent) -> AgentHandle:
        return self._of(Path(agent.run_dir)).reattach(agent)

    def fence(self, run_dir: Path) -> bool:
        return self._of(run_dir).fence(run_dir)
