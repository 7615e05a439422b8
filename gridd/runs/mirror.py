"""The daemon's mirror of a remote run directory: what the pool watches, whatever the box.

The pool watches a local run directory (``output.log``, ``heartbeat.ndjson``, ``exit.json``;
``pool/watching.py``). For a run in a box the mirror makes that directory: each look asks
the in-box shim (``runs/boxshim.py`` ``poll``) for the bytes past the mirror's own sizes
and appends them, so every byte is copied exactly once and in order, and a restarted
daemon resumes from the offset its files already have. Once the box says the agent
exited, the mirror reads the rest, brings the result branch into the task's worktree
(a bundle, fetched and fast-forwarded), and only then writes ``exit.json``: the last file,
as the local shim writes it, so that whoever sees it finds the output and the result in.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridd.runs.boxes import BoxError, BoxGone, Engine
from gridd.runs.output import _append as append

log = logging.getLogger(__name__)

#: Bytes of each file per look: a flood is copied over several looks, in order.
CHUNK = 1 << 20
MIRRORED = ("output.log", "heartbeat.ndjson")
#: Messages for the box's inbox not yet in it (``<seq>.msg``, ``<seq>.close``).
OUTBOX = "outbox"


@dataclass
class RunMirror:
    """One run: its local directory, its box, and where the result goes."""

    run_dir: Path
    engine: Engine
    box: str
    #: The task's worktree (on this machine) and branch, and the commit the box started on.
    worktree: Path
    branch: str
    base: str
    #: What the last look saw: the box's agent.json, whether the box is there.
    agent: dict[str, Any] | None = None
    running: bool = True
    lost: str | None = None
    done: bool = False
    highest_inbox: int = 0
    failures: int = field(default=0, repr=False)
    outbox_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def exit_path(self) -> Path:
        return self.run_dir / "exit.json"

    def heard(self, agent: dict[str, Any]) -> None:
        """The shim said the agent runs (its news, before any look): as a look would."""
        self.agent = agent
        if not (self.run_dir / "agent.json").exists():
            _write_atomic(self.run_dir / "agent.json", json.dumps(agent).encode())

    def look(self) -> bool:
        """Copy what is new; finish the run once the box says it exited. True when
        something changed (copied, finished or lost)."""
        if self.done or self.exit_path().exists():
            self.done = True
            return False
        sizes = {name: _size(self.run_dir / name) for name in MIRRORED}
        try:
            raw = self.engine.exec(
                self.box, ["poll", str(sizes[MIRRORED[0]]), str(sizes[MIRRORED[1]]), str(CHUNK)]
            )
        except BoxGone as exc:
            self.running = False
            if exc.reason is not None:
                # The engine knows why (out of memory, a deadline, an eviction): that is
                # the run's exit record, never a success, with what was copied so far.
                # What the box held beyond it is lost with the box.
                signum = 9 if exc.reason == "oom_killed" else None
                self._finish(
                    {"exitCode": None, "signal": signum, "error": exc.message},
                    reason=exc.reason,
                )
                return True
            self.lost = exc.message
            return True
        except BoxError as exc:
            self.failures += 1
            log.warning("run %s: looking at box %s failed: %s", self.run_dir.name, self.box, exc)
            return False
        self.failures = 0
        head, _, body = raw.partition(b"\n")
        state = json.loads(head)
        self.agent = state.get("agent") or self.agent
        self.highest_inbox = max(self.highest_inbox, int(state.get("inbox") or 0))
        if state.get("exit") is None:
            self._deliver()
        copied = 0
        for name in MIRRORED:
            n = int(state["sizes"][name])
            data, body = body[:n], body[n:]
            if data:
                append(str(self.run_dir / name), data)
                copied += len(data)
        if self.agent is not None and not (self.run_dir / "agent.json").exists():
            _write_atomic(self.run_dir / "agent.json", json.dumps(self.agent).encode())
        box_exit = state.get("exit")
        if box_exit is not None and copied == 0:
            # Exited, and nothing was left to copy (the last look read to the end).
            self._finish(box_exit)
            return True
        return copied > 0

    # -- stdin: the outbox ---------------------------------------------------------------

    def queue(self, data: bytes, kind: str) -> None:
        """Keep a message for the box's inbox, after every earlier one; the next look puts
        it in (``_deliver``), off the event loop. On disk first (``outbox/``), so that a
        restarted daemon still delivers it."""
        with self.outbox_lock:
            pending = self._pending()
            order = (pending[-1][0] if pending else 0) + 1
            folder = self.run_dir / OUTBOX
            folder.mkdir(exist_ok=True)
            _write_atomic(folder / f"{order:08d}.{kind}", data)

    def _pending(self) -> list[tuple[int, int | None, str, Path]]:
        """The outbox in order: (order, the inbox number it was given or None, kind, file).
        A message is named ``<order>.<kind>``, then ``<order>-<number>.<kind>`` once given
        its number, just before its first put."""
        try:
            names = os.listdir(self.run_dir / OUTBOX)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            stem, _, kind = name.partition(".")
            order, _, number = stem.partition("-")
            if order.isdigit() and (not number or number.isdigit()) and kind in ("msg", "close"):
                seq = int(number) if number else None
                found.append((int(order), seq, kind, self.run_dir / OUTBOX / name))
        return sorted(found, key=lambda item: item[0])

    def _deliver(self) -> None:
        """Put what the outbox holds into the box, in order, each once. Called right after
        a look read the box's highest inbox number: a message is numbered after it (and
        keeps that number, so that a put tried again is the same message: the box keeps
        it once); what the box could not take now stays for the next look."""
        with self.outbox_lock:
            pending = self._pending()
        for order, seq, kind, path in pending:
            if seq is None:
                seq = self.highest_inbox + 1
                numbered = path.with_name(f"{order:08d}-{seq:08d}.{kind}")
                os.replace(path, numbered)
                path = numbered
            data = path.read_bytes()
            try:
                answer = self.engine.exec(
                    self.box, ["put", str(seq), str(len(data)), kind], stdin=data
                )
            except (BoxGone, BoxError) as exc:  # the next look tries again, or sees it gone
                log.warning("run %s: inbox message %d not put: %s", self.run_dir.name, seq, exc)
                return
            if answer.strip() not in (b"new", b"dup"):
                log.warning(
                    "run %s: inbox message %d not taken: %r", self.run_dir.name, seq, answer
                )
                return
            self.highest_inbox = max(self.highest_inbox, seq)
            path.unlink(missing_ok=True)

    def _finish(self, box_exit: dict[str, Any], *, reason: str | None = None) -> None:
        record = {
            "exitCode": box_exit.get("exitCode"),
            "signal": box_exit.get("signal"),
            "error": box_exit.get("error"),
            "reason": reason or box_exit.get("reason"),
        }
        head = box_exit.get("head")
        if head and head != self.base:  # a failed run's work too: the finisher keeps it
            try:
                self._fetch_result(head)
            except (OSError, subprocess.CalledProcessError, BoxError) as exc:
                stderr = getattr(exc, "stderr", b"") or b""
                record["error"] = (
                    f"the result branch could not be brought back from box {self.box}: {exc}"
                    f" {stderr.decode(errors='replace').strip()}"
                )
                if isinstance(exc, BoxError):
                    return  # transient: try again at the next look
        _write_atomic(self.exit_path(), json.dumps(record).encode())
        self.done = True
        self.running = False

    def _fetch_result(self, head: str) -> None:
        """The box's branch into the task's worktree: fetched from its bundle, then a
        fast-forward (the worktree is the task's, at the base the box started from)."""
        bundle = self.engine.exec(self.box, ["cat", "result.bundle"])
        fd, name = tempfile.mkstemp(prefix="result-", suffix=".bundle", dir=self.run_dir)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(bundle)
            git = ["git", "-C", str(self.worktree)]
            subprocess.run(
                [*git, "fetch", "--quiet", "--no-tags", name, self.branch],
                check=True,
                capture_output=True,
            )
            subprocess.run(
                [*git, "merge", "--quiet", "--ff-only", head], check=True, capture_output=True
            )
        finally:
            os.unlink(name)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
