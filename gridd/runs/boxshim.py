"""The in-box shim: gridd's supervisor for one run inside a box (a container, a pod).

Run as ``python3 -I -S boxshim.py <command> <root> ...`` inside the box; it imports only the
standard library, since the box holds git and Python and nothing of gridd. ``<root>`` holds
what the daemon put in (``spec.json``, ``base.bundle``; in ``<root>/in/`` when the engine
mounts them there read-only, as podman does) and what the run makes::

    <root>/run/        output.log, heartbeat.ndjson, agent.json, exit.json, inbox/
    <root>/work/       the task's branch, cloned from base.bundle
    <root>/result.bundle   the task's branch once the agent has exited

Commands (the daemon reaches them through the engine's exec; nothing relies on closing an
exec's stdin, which the older exec protocols cannot do):

``run``      the box's main process: clone the base, start the agent (output appended to
             ``run/output.log``), deliver the inbox to its stdin, and once it has exited commit
             what it left, bundle the branch and write ``run/exit.json`` last. Then it waits
             to be removed, so that the daemon can still read everything. Its own stdout
             carries its news, one JSON line each: ``{"agent": ...}`` once the agent runs
             (or ``{"exit": ...}`` when it could not start), for an engine that keeps that
             output where the daemon reads it without an exec (``boxes.Announcing``).
``poll``     one line of JSON (the run's state and file sizes), then the output and heartbeat
             bytes from the given offsets: how the daemon's mirror copies them, by offset.
``put``      one inbox message, numbered by the daemon: exactly ``<size>`` bytes read from
             stdin, kept only if that number is new (a retried put is not a second message).
``signal``   a signal to the agent's process group.
``handles``  whether the agent catches or ignores a signal (``1``, ``0``, ``?``).
``cat``      a file of the root, whole (the result bundle).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, NoReturn

POLL = 0.05


def _paths(root: str) -> tuple[str, str, str]:
    run = os.path.join(root, "run")
    return run, os.path.join(run, "inbox"), os.path.join(root, "work")


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _input(root: str, name: str) -> str:
    """Where the daemon put an input file: ``<root>/in/`` (mounted), else ``<root>/``."""
    mounted = os.path.join(root, "in", name)
    return mounted if os.path.exists(mounted) else os.path.join(root, name)


def _announce(news: dict[str, Any]) -> None:
    """One line of news on the shim's own stdout (``boxes.shim_news`` reads it)."""
    sys.stdout.write(json.dumps(news) + "\n")
    sys.stdout.flush()


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError):
        return None


def _git(cwd: str, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)
    return done.stdout.decode().strip()


def _pump(inbox: str, proc: subprocess.Popen[bytes]) -> None:
    """Deliver the inbox to the agent's stdin: message n+1 only after n, each once (the
    cursor file says how far it got, for people and for a restarted shim's reader)."""
    seq = 1
    stdin = proc.stdin
    assert stdin is not None
    while proc.poll() is None:
        base = os.path.join(inbox, f"{seq:08d}")
        if os.path.exists(base + ".close"):
            stdin.close()
            _write_atomic(os.path.join(inbox, "cursor"), str(seq).encode())
            return
        try:
            with open(base + ".msg", "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            time.sleep(POLL)
            continue
        try:
            stdin.write(data)
            stdin.flush()
        except (BrokenPipeError, ValueError):
            return
        _write_atomic(os.path.join(inbox, "cursor"), str(seq).encode())
        seq += 1


def run(root: str) -> int:
    run_dir, inbox, work = _paths(root)
    os.makedirs(inbox, exist_ok=True)
    spec = _read_json(_input(root, "spec.json"))
    exit_path = os.path.join(run_dir, "exit.json")
    if os.path.exists(exit_path):
        return _linger()
    record: dict[str, Any] = {"exitCode": None, "signal": None, "error": None}
    try:
        if not os.path.isdir(work):
            subprocess.run(
                [
                    "git",
                    "clone",
                    "-q",
                    "-b",
                    spec["branch"],
                    _input(root, "base.bundle"),
                    work,
                ],
                check=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        out = os.open(os.path.join(run_dir, "output.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        # The box's own environment (its PATH, HOME, the secrets its engine gave it by
        # reference), then what the daemon says the agent needs.
        env = {**os.environ, **spec["env"]}
        env["GRID_HEARTBEAT"] = os.path.join(run_dir, "heartbeat.ndjson")
        stdin = subprocess.PIPE if spec.get("stdin", "pipe") == "pipe" else subprocess.DEVNULL
        proc = subprocess.Popen(
            spec["argv"],
            cwd=work,
            env=env,
            stdin=stdin,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        os.close(out)
    except (OSError, subprocess.CalledProcessError, KeyError, TypeError) as exc:
        detail = getattr(exc, "stdout", None) or b""
        why = detail.decode(errors="replace").strip()
        record["error"] = f"could not start the agent in the box: {exc} {why}"
        _write_atomic(exit_path, json.dumps(record).encode())
        _announce({"exit": record})
        return _linger()
    agent = {"pid": proc.pid, "shimPid": os.getpid(), "startedAt": time.time()}
    _announce({"agent": agent})  # first: the spawn waits for it, not for the fsync below
    _write_atomic(os.path.join(run_dir, "agent.json"), json.dumps(agent).encode())

    def forward(signum: int, frame: object) -> None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if proc.stdin is not None:
        threading.Thread(target=_pump, args=(inbox, proc), daemon=True).start()
    kills = _oom_kills()
    status = proc.wait()
    if status < 0:
        record["signal"] = -status
    else:
        record["exitCode"] = status
    if status == -signal.SIGKILL and kills is not None and (_oom_kills() or 0) > kills:
        # The kernel's OOM killer, at the box's memory limit: say so, not just "SIGKILL".
        record["reason"] = "oom_killed"
        record["error"] = (
            "out of memory: the box reached its memory limit; the kernel killed the agent"
        )
    try:
        record.update(_result(root, spec))
    except (OSError, subprocess.CalledProcessError) as exc:
        why = (getattr(exc, "stderr", None) or b"").decode(errors="replace").strip()
        record["error"] = f"could not bundle the result: {exc} {why}"
    _write_atomic(exit_path, json.dumps(record).encode())
    return _linger()


#: Where the box's cgroup counts its OOM kills (v2, then v1), as the box sees it.
OOM_EVENTS = (
    ("/sys/fs/cgroup/memory.events", "oom_kill"),
    ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
)


def _oom_kills() -> int | None:
    for path, key in OOM_EVENTS:
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    return None


def _result(root: str, spec: dict[str, Any]) -> dict[str, str]:
    """Commit what the agent left uncommitted, and bundle the branch past the base."""
    work = _paths(root)[2]
    _git(work, "add", "-A")
    if _git(work, "status", "--porcelain"):
        _git(
            work,
            "-c",
            "user.name=gridd",
            "-c",
            "user.email=gridd@localhost",
            "commit",
            "-q",
            "--no-verify",
            "-m",
            "grid: work the agent left uncommitted",
        )
    head = _git(work, "rev-parse", "HEAD")
    if head != spec["base"]:
        _git(
            work,
            "bundle",
            "create",
            "-q",
            os.path.join(root, "result.bundle"),
            spec["branch"],
            "^" + spec["base"],
        )
    return {"head": head}


def _linger() -> NoReturn:
    """Wait to be removed: the daemon still reads the run and the result."""
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
    while True:
        time.sleep(3600)


def poll(root: str, out_off: int, beat_off: int, limit: int) -> int:
    run_dir, inbox, _ = _paths(root)
    chunks = []
    sizes = {}
    for name, offset in (("output.log", out_off), ("heartbeat.ndjson", beat_off)):
        data = b""
        try:
            with open(os.path.join(run_dir, name), "rb") as fh:
                fh.seek(offset)
                data = fh.read(limit)
        except FileNotFoundError:
            pass
        sizes[name] = len(data)
        chunks.append(data)
    head = {
        "agent": _read_json(os.path.join(run_dir, "agent.json")),
        "exit": _read_json(os.path.join(run_dir, "exit.json")),
        "sizes": sizes,
        "inbox": _highest(inbox),
    }
    out = sys.stdout.buffer
    out.write(json.dumps(head).encode() + b"\n")
    for data in chunks:
        out.write(data)
    out.flush()
    return 0


def _highest(inbox: str) -> int:
    try:
        names = os.listdir(inbox)
    except FileNotFoundError:
        return 0
    seqs = [int(n[:8]) for n in names if n[:8].isdigit() and n.endswith((".msg", ".close"))]
    return max(seqs, default=0)


def put(root: str, seq: int, size: int, kind: str) -> int:
    _, inbox, _ = _paths(root)
    data = sys.stdin.buffer.read(size)
    if len(data) != size:
        sys.stdout.write("short\n")
        return 1
    os.makedirs(inbox, exist_ok=True)
    final = os.path.join(inbox, f"{seq:08d}.{kind}")
    tmp = os.path.join(inbox, f".{seq:08d}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, final)
        answer = "new"
    except FileExistsError:
        answer = "dup"
    os.unlink(tmp)
    sys.stdout.write(answer + "\n")
    return 0


def send_signal(root: str, signum: int) -> int:
    info = _read_json(os.path.join(_paths(root)[0], "agent.json"))
    if not info:
        sys.stdout.write("0\n")
        return 0
    try:
        os.killpg(info["pid"], signum)
        if signum in (signal.SIGTERM, signal.SIGINT):
            os.killpg(info["pid"], signal.SIGCONT)
    except ProcessLookupError:
        sys.stdout.write("0\n")
        return 0
    sys.stdout.write("1\n")
    return 0


def handles(root: str, signum: int) -> int:
    """``1`` when the agent catches or ignores ``signum`` (its /proc masks), ``0`` when not,
    ``?`` when that cannot be read."""
    info = _read_json(os.path.join(_paths(root)[0], "agent.json")) or {}
    masks = []
    try:
        with open(f"/proc/{int(info['pid'])}/status") as fh:
            for line in fh:
                if line.startswith(("SigIgn:", "SigCgt:")):
                    masks.append(int(line.split()[1], 16))
    except (OSError, KeyError, TypeError, ValueError, IndexError):
        masks = []
    if len(masks) != 2:
        sys.stdout.write("?\n")
    else:
        sys.stdout.write("1\n" if any(m & (1 << (signum - 1)) for m in masks) else "0\n")
    return 0


def cat(root: str, name: str) -> int:
    with open(os.path.join(root, name), "rb") as fh:
        while True:
            data = fh.read(1 << 20)
            if not data:
                break
            sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


def main(argv: list[str]) -> int:
    command, root, rest = argv[1], argv[2], argv[3:]
    if command == "run":
        return run(root)
    if command == "poll":
        return poll(root, int(rest[0]), int(rest[1]), int(rest[2]))
    if command == "put":
        return put(root, int(rest[0]), int(rest[1]), rest[2])
    if command == "signal":
        return send_signal(root, int(rest[0]))
    if command == "cat":
        return cat(root, rest[0])
    if command == "handles":
        return handles(root, int(rest[0]))
    sys.stderr.write(f"unknown command {command!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv) or 0)
