"""A daemon at rest has loaded only what it uses.

Libraries for rarely used paths (webhooks, the Prometheus exposition, YAML, terminal
rendering, process inspection) and uvicorn's command line (click, the reload and
multiprocess supervisors) are imported when first needed, never at startup. The figures
(start time, idle memory) are in bench/; these tests prove the behaviour behind them, and
that what was put off still loads whole when asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Never imported by a daemon that has started and answered /health with nothing to do.
NOT_AT_REST = (
    "click",
    "uvicorn.main",
    "uvicorn.supervisors",
    "multiprocessing",
    "watchfiles",
    "aiohttp",
    "prometheus_client",
    "yaml",
    "rich",
    "psutil",
    "httpx",
    "importlib.metadata",
    "ctypes",
    "sse_starlette",  # on the first GET /events
    *("_ssl", "_hashlib"),  # OpenSSL: an https webhook, a committed config's sha256
)

#: Never imported while an editor follows the event stream and nothing else happens.
NOT_WITH_A_STREAM = ("_ssl", "_hashlib", "aiohttp", "httpx")

#: Runs the real daemon (``gridd``'s own ``main``) in this interpreter; once /health
#: answers 200 it records sys.modules (and whether the cycle collector is back on) and
#: stops the daemon the way SIGTERM does.
_RUN_AND_RECORD = r"""
import gc, json, os, signal, socket, sys, threading, time
from pathlib import Path

root, out = Path(sys.argv[1]), Path(sys.argv[2])
follow = sys.argv[3:] == ["--follow-events"]

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
    if follow:  # an editor attached: the stream has answered and is held open
        stream = socket.socket(socket.AF_UNIX)
        stream.settimeout(10)
        stream.connect(str(root / ".grid" / "gridd.sock"))
        stream.sendall(b"GET /events HTTP/1.1\r\nhost: gridd\r\naccept: text/event-stream\r\n\r\n")
        assert stream.recv(64).startswith(b"HTTP/1.1 200 ")
    modules = sorted(m for m, mod in sys.modules.items() if mod is not None)
    while not gc.isenabled() and time.monotonic() < deadline:  # paused for the start only
        time.sleep(0.01)
    out.write_text(json.dumps({"modules": modules, "gc": gc.isenabled()}))
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=record_when_up, daemon=True).start()
from gridd.cli.gridd_main import main
sys.exit(main(["--workspace", str(root)]))
"""


def _loaded(code: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_daemon_at_rest_has_not_imported_rarely_used_libraries(repo: Path, tmp_path: Path) -> None:
    record = tmp_path / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", _RUN_AND_RECORD, str(repo), str(record)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    recorded = json.loads(record.read_text())
    loaded = set(recorded["modules"])
    assert "gridd.daemon" in loaded and "gridd.scheduler" in loaded  # it really ran
    assert sorted(m for m in NOT_AT_REST if m in loaded) == []
    assert recorded["gc"] is True  # the collector, paused for the start, runs again


def test_daemon_followed_by_an_event_stream_has_not_loaded_openssl(
    repo: Path, tmp_path: Path
) -> None:
    record = tmp_path / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", _RUN_AND_RECORD, str(repo), str(record), "--follow-events"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = set(json.loads(record.read_text())["modules"])
    assert "sse_starlette" in loaded and "anyio.streams.tls" in loaded  # the stream ran
    assert sorted(m for m in NOT_WITH_A_STREAM if m in loaded) == []


def test_uvicorn_package_loads_whole_on_first_use_after_the_daemon_import() -> None:
    loaded = _loaded(
        "import gridd.daemon, sys\n"
        "assert 'uvicorn.main' not in sys.modules and 'click' not in sys.modules\n"
        "import uvicorn\n"
        "assert uvicorn.__version__ and callable(uvicorn.run) and callable(uvicorn.main)\n"
        "from uvicorn import Server, Config\n"
        "from uvicorn.main import Server as MainServer\n"
        "assert Server is MainServer and Config is gridd.daemon.Config"
    )
    assert {"uvicorn.main", "click"} <= loaded


def test_event_stream_module_leaves_uvicorn_main_importable() -> None:
    # sse-starlette is imported as if uvicorn's CLI were absent; the CLI must not stay
    # blocked for anyone importing it later.
    loaded = _loaded(
        "import gridd.api.sse, sys\n"
        "assert 'sse_starlette' not in sys.modules\n"
        "gridd.api.sse.sse_library()\n"
        "assert 'sse_starlette' in sys.modules and 'uvicorn.main' not in sys.modules\n"
        "import uvicorn.main\n"
        "assert sys.modules['uvicorn.main'] is uvicorn.main"
    )
    assert "uvicorn.main" in loaded
