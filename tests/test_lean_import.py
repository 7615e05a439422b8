"""A daemon at rest has loaded only what it uses.

Libraries for rarely used paths (webhooks, the Prometheus exposition, YAML, terminal
rendering, process inspection) are imported when first needed, never at startup, and the
objects the start built are frozen out of the cycle collector's sight once the daemon
serves. The figures (start time, idle memory) are in bench/; these tests prove the
behaviour behind them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Never imported by a daemon that has started and answered /health with nothing to do.
NOT_AT_REST = (
    "aiohttp",
    "prometheus_client",
    "yaml",
    "rich",
    "psutil",
    "httpx",
    "importlib.metadata",
    "ctypes",
    "sse_starlette",  # on the first GET /events
    # gridd's own rarely used rooms: built or called when a run first goes there
    "gridd.runs.kubernetes",  # a run with executor = "kubernetes"
    "gridd.runs.podwatch",
    "gridd.runs.remote",  # a run in a box, or the first spawn
    "gridd.runs.mirror",
    "gridd.runs.podman",  # a run with executor = "podman"
    "gridd.runs.seatbelt",  # a sandboxed spawn (macOS)
)

#: Runs the real daemon (``gridd``'s own ``main``) in this interpreter; once /health
#: answers 200 it records sys.modules and, once the start's objects are frozen (or a
#: minute has passed), how many are; then it stops the daemon the way SIGTERM does.
_RUN_AND_RECORD = r"""
import gc, json, os, signal, socket, sys, threading, time
from pathlib import Path

root, out = Path(sys.argv[1]), Path(sys.argv[2])

def healthy(path):
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(path))
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: gridd\r\nconnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200 ")
    except OSError:
        return False

def record_when_up():
    deadline = time.monotonic() + 60
    while not healthy(root / ".grid" / "gridd.sock") and time.monotonic() < deadline:
        time.sleep(0.01)
    modules = sorted(m for m, mod in sys.modules.items() if mod is not None)
    while not gc.get_freeze_count() and time.monotonic() < deadline:
        time.sleep(0.01)
    out.write_text(json.dumps({"modules": modules, "frozen": gc.get_freeze_count()}))
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=record_when_up, daemon=True).start()
from gridd.cli.gridd_main import main
sys.exit(main(["--workspace", str(root)]))
"""


def _run_and_record(repo: Path, tmp_path: Path) -> dict[str, Any]:
    record = tmp_path / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", _RUN_AND_RECORD, str(repo), str(record)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    recorded: dict[str, Any] = json.loads(record.read_text())
    return recorded


def test_daemon_at_rest_has_not_imported_rarely_used_libraries(repo: Path, tmp_path: Path) -> None:
    loaded = set(_run_and_record(repo, tmp_path)["modules"])
    assert "gridd.daemon" in loaded and "gridd.scheduler" in loaded  # it really ran
    assert sorted(m for m in NOT_AT_REST if m in loaded) == []


def test_daemon_freezes_its_start_up_objects_once_serving(repo: Path, tmp_path: Path) -> None:
    # The classes, functions and validators the imports built sit in the permanent
    # generation: later full collections do not walk them.
    assert _run_and_record(repo, tmp_path)["frozen"] > 10_000
