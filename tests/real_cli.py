"""What the real-CLI tests (Claude Code, Codex, Gemini CLI, opencode) share: where each
pinned CLI is installed, the agent profile that runs it against a loopback stand-in of its
provider's API, starting a task, the newest agent of a task, the argv a run was started
with, its cost counted once, wall-clock times read back from the API, and the CLI's own
output shown when a test fails. ``bench/bench_agent_clis.py`` runs the same profiles.

The CLIs, their npm packages and their pinned versions are listed once, in
``tests/tools/agent-clis.txt``; ``tests/tools/install-cli.sh`` installs each under
``.cache/clis/<name>/`` (``make test`` does), or under ``$GRIDD_AGENT_CLIS/<name>/`` when that
is set (``make test-agents-latest`` points it at the newest versions).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gridd.client import GridClient
from gridd.settings import (
    CLAUDE_PERMISSION_ARGS,
    CLAUDE_STREAM_ARGS,
    CODEX_EXEC_ARGS,
    GEMINI_STREAM_ARGS,
    OPENCODE_RUN_ARGS,
)
from tests.standin import ScriptedAPI
from tests.support.api import wait_task_status
from tests.support.daemons import core_daemon
from tests.support.git import git_show
from tests.support.sse import event_log

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "tests" / "tools" / "agent-clis.txt"


def clis_root() -> Path:
    """Where the CLIs under test are installed, one directory each."""
    return Path(os.environ.get("GRIDD_AGENT_CLIS") or ROOT / ".cache" / "clis")


def pin(name: str) -> dict[str, str]:
    """The line of ``agent-clis.txt`` for ``name``: package, version, platform, program."""
    for line in PINS.read_text().splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#") and fields[0] == name:
            keys = ("name", "package", "version", "platform", "program")
            return dict(zip(keys, fields, strict=True))
    raise KeyError(f"no CLI named {name!r} in {PINS}")


def program(name: str) -> Path:
    """The CLI's program (a native binary, or gemini's bundled JavaScript file)."""
    return clis_root() / name / pin(name)["program"]


def installed_version(name: str) -> str | None:
    """The version of ``name`` the tests will run, or None when it is not installed."""
    said = clis_root() / name / "version"
    return said.read_text().strip() if said.exists() and program(name).exists() else None


def needs(name: str) -> pytest.MarkDecorator:
    """Skip the test unless the CLI is installed."""
    return pytest.mark.skipif(
        installed_version(name) is None,
        reason=f"run tests/tools/install-cli.sh {name} (make test does)",
    )


def marks(name: str) -> list[pytest.MarkDecorator]:
    """A real-CLI test module's ``pytestmark``: the CLI installed, a generous timeout."""
    return [needs(name), pytest.mark.timeout(180)]


# -- the profiles: each CLI against a stand-in at ``url`` ------------------------------------


def claude_profile(
    url: str, home: Path, *, oauth: bool = False, retries: int = 0, **options: Any
) -> dict[str, object]:
    """Claude Code against ``tests/anthropic_standin.py``; ``options`` are the adapter's."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": url,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_RETRIES": str(retries),
    }
    # A subscriber's token makes the CLI report its usage limits (rate_limit_event).
    env["CLAUDE_CODE_OAUTH_TOKEN" if oauth else "ANTHROPIC_API_KEY"] = "sk-ant-standin-dummy"
    return {
        "adapter": "claude",
        "stdin": "pipe",
        "command": [str(program("claude")), *CLAUDE_STREAM_ARGS, *CLAUDE_PERMISSION_ARGS],
        "adapter_options": {"permission_prompt_tool": "stdio", **options},
        "env": env,
        "launch_grace_seconds": 60,
    }


@contextmanager
def codex_home(url: str, model: str) -> Iterator[Path]:
    """A ``CODEX_HOME`` whose provider is the stand-in (codex ignores ``OPENAI_BASE_URL``).
    Under ``.cache/``: codex's sandbox fails when its home is under the temporary directory."""
    home = ROOT / ".cache" / "codex-homes" / uuid.uuid4().hex[:12]
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "standin"\n'
        "[model_providers.standin]\n"
        'name = "standin"\n'
        f'base_url = "{url}/v1"\n'
        'env_key = "STANDIN_API_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def codex_profile(home: Path, model: str) -> dict[str, object]:
    """Codex against ``tests/openai_standin.py``, its provider in ``home`` (``codex_home``)."""
    return {
        "adapter": "codex",
        "stdin": "null",
        "command": [str(program("codex")), *CODEX_EXEC_ARGS, "-m", model, "{prompt}"],
        "env": {"CODEX_HOME": str(home), "STANDIN_API_KEY": "sk-standin-dummy"},
        "launch_grace_seconds": 60,
    }


def gemini_profile(url: str, home: Path, model: str) -> dict[str, object]:
    """Gemini CLI against ``tests/gemini_standin.py``. It needs ``selectedType =
    "gemini-api-key"`` in its settings.json (else exit 41), written into ``home``."""
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    command = ["node", str(program("gemini")), *GEMINI_STREAM_ARGS, "-m", model, "-p", "{prompt}"]
    return {
        "adapter": "gemini",
        "stdin": "null",
        "command": command,
        "env": {"HOME": str(home), "GOOGLE_GEMINI_BASE_URL": url, "GEMINI_API_KEY": "dummy"},
        "launch_grace_seconds": 60,
    }


def opencode_profile(url: str, home: Path) -> dict[str, object]:
    """opencode against ``tests/anthropic_standin.py`` (its bundled ``anthropic`` provider,
    ``baseURL`` in the config), its state under ``home``, edits and commands allowed."""
    home.mkdir(parents=True, exist_ok=True)
    config = {
        "model": "anthropic/claude-sonnet-4-5",
        "provider": {"anthropic": {"options": {"baseURL": f"{url}/v1", "apiKey": "sk-ant-x"}}},
        "permission": {"edit": "allow", "bash": "allow"},
        "autoupdate": False,
        "share": "disabled",
    }
    return {
        "adapter": "opencode",
        "stdin": "null",
        "command": [str(program("opencode")), *OPENCODE_RUN_ARGS, "{prompt}"],
        "env": {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local/share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local/state"),
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        },
        "launch_grace_seconds": 90,
    }


# -- a task's run, read back --------------------------------------------------------------


def start(c: GridClient, task_id: str, *, prompt: str = "do the task", **task: object) -> None:
    """Add the task and start a session (which starts it)."""
    c.post("/tasks", {"id": task_id, "title": task_id, "prompt": prompt, **task})
    c.post("/session/start", {"featureBranch": "feature/real-cli"})


def agent_of(c: GridClient, task_id: str) -> dict[str, Any]:
    """The task's newest agent run, exited or not."""
    agents = [a for a in c.get("/agents", params={"all": "1"}) if a["taskId"] == task_id]
    return agents[-1]  # type: ignore[no-any-return]


def spec_argv(agent: dict[str, Any]) -> list[str]:
    """The argv the run was started with (its run directory's spec.json)."""
    spec = json.loads((Path(agent["runDir"]) / "spec.json").read_text())
    return [str(a) for a in spec["argv"]]


#: What the second reply of a ``killed_mid_run`` script says.
AFTER_RESTART = "Wrote kept.txt after the restart."


@contextmanager
def killed_mid_run(
    repo: Path, api: ScriptedAPI[Any], *, gate: threading.Event, timeout: float = 90.0
) -> Iterator[tuple[GridClient, dict[str, Any]]]:
    """Task ``crash`` run by the profile in ``repo``'s config, scripted by the caller: a
    first reply that writes ``kept.txt`` ("kept\\n"), then ``AFTER_RESTART`` held by
    ``gate``. The daemon is killed with SIGKILL while the CLI waits for that second answer,
    which is released then (the CLI goes on with no daemon), and a new daemon reattaches
    the run. Yields the new daemon's client and the agent once the task is in review,
    having checked that it is the same run, finished, in the same session, said the second
    answer, was spawned once, and that ``kept.txt`` is committed."""
    with core_daemon(repo) as first:
        c = first.client()
        start(c, "crash")
        api.wait_turns(2, timeout=timeout)  # the write is done; the CLI waits for the model
        before = agent_of(c, "crash")
        first.kill9()
        gate.set()  # the CLI goes on while no daemon runs
        with core_daemon(repo) as second:
            c2 = second.client()
            wait_task_status(c2, "crash", "review", timeout=timeout)
            assert git_show(repo, "grid/crash:kept.txt") == "kept\n"
            agent = agent_of(c2, "crash")
            assert agent["id"] == before["id"] and agent["exitCode"] == 0
            assert agent["result"] == AFTER_RESTART
            assert agent["sessionId"] == before["sessionId"]
            assert len(event_log(c2, types={"agent.spawned"})) == 1
            yield c2, agent


def assert_cost_counted_once(c: GridClient, task_id: str, usd: float) -> None:
    """The task's one agent, the task and its ``agent.completed`` all say ``usd``."""
    assert agent_of(c, task_id)["costUsd"] == pytest.approx(usd)
    assert c.get(f"/tasks/{task_id}")["costUsd"] == pytest.approx(usd)
    [completed] = event_log(c, types={"agent.completed"})
    assert completed.data["costUsd"] == pytest.approx(usd)


def epoch(value: str) -> float:
    """Epoch seconds of an API timestamp."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@contextmanager
def shown_on_failure(repo: Path, *, last: int = 40) -> Iterator[None]:
    """Print the last lines each run of the test printed (``output.log``) when the block
    ends: pytest shows what a test printed only when it fails, so a failing test shows what
    the CLI said, and its program's path (drift in a newer version is read from there)."""
    try:
        yield
    finally:
        for log in sorted((repo / ".grid" / "runs").glob("*/output.log")):
            spec = log.parent / "spec.json"
            argv = json.loads(spec.read_text()).get("argv", []) if spec.exists() else []
            print(f"--- the last {last} lines of {log} ({' '.join(map(str, argv))[:200]}) ---")
            print("\n".join(log.read_text(errors="replace").splitlines()[-last:]))
