"""One watch on a workspace's pods, fanned out to the runs waiting for theirs.

The kubernetes engine's runs wait for their pod to run (scheduled, image pulled) before
the run is put in. Rather than each listing its pod until then, one watch (a thread, started
at the first wait) follows every pod carrying the workspace's label and keeps the newest
of each, by the box label; a waiting run is woken at each change. When the watch ends or
fails (the API server closed it, the connection broke) it is opened again after a pause,
and what it streams first (every pod there is, as ADDED) brings the copy up to date.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: The pause before a watch that ended is opened again.
REOPEN_SECONDS = 1.0


class PodWatch:
    """Pods carrying ``labels`` in ``namespace``, as the one watch last saw them."""

    def __init__(
        self,
        client: Callable[[], Any],
        *,
        namespace: str,
        labels: dict[str, str],
        box_label: str,
        opened: Callable[[], None] = lambda: None,
    ) -> None:
        self._client = client
        self.namespace = namespace
        self.labels = labels
        self.box_label = box_label
        self._opened = opened  # counts each watch opened (the benchmark's figure)
        self._pods: dict[str, dict[str, Any]] = {}  # box label value -> newest pod
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        with self._changed:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._follow, name="pod-watch", daemon=True)
                self._thread.start()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wake(self) -> None:
        """Every wait looks again at once (its ``stop`` may hold now)."""
        with self._changed:
            self._changed.notify_all()

    def wait(
        self,
        box: str,
        done: Callable[[dict[str, Any]], bool],
        timeout: float,
        *,
        stop: Callable[[], bool] = lambda: False,
    ) -> Any:
        """The pod of ``box`` once ``done(pod)`` holds, or the last seen (None: none yet)
        when ``timeout`` passes first, or ``stop()`` holds when woken (``wake``)."""
        self.start()
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                pod = self._pods.get(box)
                left = deadline - time.monotonic()
                if (pod is not None and done(pod)) or left <= 0 or self._closed or stop():
                    return pod
                self._changed.wait(left)

    def _follow(self) -> None:
        from lightkube.resources.core_v1 import Pod

        while not self._closed:
            try:
                self._opened()
                stream = self._client().watch(Pod, namespace=self.namespace, labels=self.labels)
                for kind, pod in stream:
                    self._seen(kind, pod.to_dict() if hasattr(pod, "to_dict") else dict(pod))
                    if self._closed:
                        return
            except Exception as exc:  # the thread must live on: opened again below
                log.warning("the watch on the workspace's pods ended: %r", exc)
            time.sleep(REOPEN_SECONDS)

    def _seen(self, kind: str, pod: dict[str, Any]) -> None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in self.labels.items()):
            return  # the selector is the server's to apply; a test double may not
        box = labels.get(self.box_label)
        if not box:
            return
        with self._changed:
            if kind == "DELETED":
                self._pods.pop(box, None)
            else:
                self._pods[box] = pod
            self._changed.notify_all()
